-- NAPLES Q12_2 (NR §4.3.3.4, listing lines 214–226): TPC-H Q12's high_line_count as a COUNT. NAPLES:
-- l_receiptdate >= 183.3 AND < 183.3 + 12 (183.3 months = day 5499 = 1995-01-21; 12 months = 360 days).
SELECT COUNT(*)
FROM orders, lineitem
WHERE
  orders.o_orderkey = lineitem.l_orderkey
  AND (orders.o_orderpriority = '1-URGENT'
       OR orders.o_orderpriority = '2-HIGH')
  AND lineitem.l_shipmode in ('TRUCK', 'SHIP')
  AND lineitem.l_commitdate < lineitem.l_receiptdate
  AND lineitem.l_shipdate < lineitem.l_commitdate
  AND lineitem.l_receiptdate >= date '1995-01-21'
  AND lineitem.l_receiptdate < date '1995-01-21' + interval '360' day
;
