-- NAPLES Q4 (NR §4.3.3.4, listing lines 79–88). NAPLES: o_orderdate >= 180 AND < 180 + 3
-- (180 months = day 5400 = 1994-10-14; 3 months = 90 days).
SELECT COUNT(*)
FROM orders, lineitem
WHERE
  orders.o_orderdate >= date '1994-10-14'
  AND orders.o_orderdate < date '1994-10-14' + interval '90' day
  AND lineitem.l_orderkey = orders.o_orderkey
  AND lineitem.l_commitdate < lineitem.l_receiptdate
  AND orders.o_orderpriority = '1-URGENT'
;
