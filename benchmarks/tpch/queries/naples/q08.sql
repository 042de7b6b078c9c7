-- NAPLES Q8 (NR §4.3.3.4, listing lines 137–157). NAPLES: o_orderdate >= 5478 AND <= 6210, here in days
-- (= 30 · 182.6 and 30 · 207, Q7's bounds: 1994-12-31 and 1997-01-01).
-- NAPLES wrote 'MEDIUM_BRUSHED_COPPER'; the generated value is 'MEDIUM BRUSHED COPPER'.
SELECT SUM(lineitem.l_extendedprice
           *(1 - lineitem.l_discount))
FROM
  part, supplier, lineitem,
  orders, customer,
  nation AS n1, nation AS n2, region
WHERE
  part.p_partkey = lineitem.l_partkey
  AND supplier.s_suppkey = lineitem.l_suppkey
  AND lineitem.l_orderkey = orders.o_orderkey
  AND orders.o_custkey = customer.c_custkey
  AND customer.c_nationkey = n1.n_nationkey
  AND n1.n_regionkey = region.r_regionkey
  AND region.r_name = 'ASIA'
  AND supplier.s_nationkey = n2.n_nationkey
  AND orders.o_orderdate >= date '1994-12-31'
  AND orders.o_orderdate <= date '1997-01-01'
  AND part.p_type = 'MEDIUM BRUSHED COPPER'
  AND n2.n_name = 'JAPAN'
;
