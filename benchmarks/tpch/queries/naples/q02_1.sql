-- NAPLES Q2_1 (NR §4.3.3.4, listing lines 44–54): the MIN of TPC-H Q2's correlated subquery.
SELECT MIN(partsupp.ps_supplycost)
FROM partsupp, supplier,
     nation, region, part
WHERE
  part.p_partkey = partsupp.ps_partkey
  AND supplier.s_suppkey = partsupp.ps_suppkey
  AND supplier.s_nationkey = nation.n_nationkey
  AND nation.n_regionkey = region.r_regionkey
  AND region.r_name = 'ASIA'
;
