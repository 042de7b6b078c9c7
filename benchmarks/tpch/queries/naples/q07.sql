-- NAPLES Q7 (NR §4.3.3.4, listing lines 118–136). NAPLES: l_shipdate between 182.6 and 207
-- (182.6 and 207 months = days 5478 and 6210 = 1994-12-31 and 1997-01-01).
SELECT SUM(lineitem.l_extendedprice
           *(1 - lineitem.l_discount))
FROM supplier, lineitem, orders, customer,
     nation as n1,
     nation as n2
WHERE
  supplier.s_suppkey = lineitem.l_suppkey
  AND orders.o_orderkey = lineitem.l_orderkey
  AND customer.c_custkey = orders.o_custkey
  AND supplier.s_nationkey = n1.n_nationkey
  AND customer.c_nationkey = n2.n_nationkey
  AND (
    (n1.n_name = 'JAPAN' and n2.n_name = 'INDONESIA')
    OR
    (n1.n_name = 'INDONESIA' and n2.n_name = 'JAPAN')
  )
  AND lineitem.l_shipdate between date '1994-12-31' and date '1997-01-01'
;
