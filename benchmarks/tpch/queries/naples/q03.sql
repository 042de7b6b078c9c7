-- NAPLES Q3 (NR §4.3.3.4, listing lines 66–78). NAPLES: o_orderdate < 190, l_shipdate > 190
-- (190 months · 30 = day 5700 after 1980-01-01 = 1995-08-10). The quoted keys '162' and '0' are kept:
-- PostgreSQL reads them as integers.
SELECT SUM(lineitem.l_extendedprice
           *(1-lineitem.l_discount))
FROM customer, orders, lineitem
WHERE
  customer.c_mktsegment = 'BUILDING'
  AND customer.c_custkey = orders.o_custkey
  AND lineitem.l_orderkey = orders.o_orderkey
  AND orders.o_orderdate < date '1995-08-10'
  AND lineitem.l_shipdate > date '1995-08-10'
  AND lineitem.l_orderkey = '162'
  AND orders.o_shippriority = '0'
;
