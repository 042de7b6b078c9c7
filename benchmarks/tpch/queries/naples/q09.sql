-- NAPLES Q9 (NR §4.3.3.4, listing lines 158–175). NAPLES wrote 'UNITED_KINGDOM'; the generated value
-- is 'UNITED KINGDOM'.
SELECT SUM(lineitem.l_extendedprice
           *(1-lineitem.l_discount)
           - partsupp.ps_supplycost*lineitem.l_quantity)
FROM
  part,     supplier,
  lineitem, partsupp,
  orders,   nation
WHERE
  supplier.s_suppkey = lineitem.l_suppkey
  AND partsupp.ps_suppkey = lineitem.l_suppkey
  AND partsupp.ps_partkey = lineitem.l_partkey
  AND part.p_partkey = lineitem.l_partkey
  AND orders.o_orderkey = lineitem.l_orderkey
  AND supplier.s_nationkey = nation.n_nationkey
  AND part.p_name LIKE '%violet%'
  AND nation.n_name = 'UNITED KINGDOM'
;
