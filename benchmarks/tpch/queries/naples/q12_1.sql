-- NAPLES Q12_1 (NR §4.3.3.4, listing lines 201–213): TPC-H Q12's low_line_count as a COUNT. NAPLES:
-- l_receiptdate >= 183.3 AND < 183.3 + 12 (183.3 months = day 5499 = 1995-01-21; 12 months = 360 days).
-- Kept as listed: (… <> '1-URGENT' OR … <> '2-HIGH') is always true (TPC-H has AND), so this counts
-- every priority — consistent with NAPLES' Table 17, where Q12_1 is about 2.4 × Q12_2.
SELECT COUNT(*)
FROM orders, lineitem
WHERE
  orders.o_orderkey = lineitem.l_orderkey
  AND (orders.o_orderpriority <> '1-URGENT'
       OR orders.o_orderpriority <> '2-HIGH')
  AND lineitem.l_shipmode in ('TRUCK', 'SHIP')
  AND lineitem.l_commitdate < lineitem.l_receiptdate
  AND lineitem.l_shipdate < lineitem.l_commitdate
  AND lineitem.l_receiptdate >= date '1995-01-21'
  AND lineitem.l_receiptdate < date '1995-01-21' + interval '360' day
;
