-- NAPLES Q2_2 (NR §4.3.3.4, listing lines 55–65): as Q2_1 with MAX.
SELECT MAX(partsupp.ps_supplycost)
FROM partsupp, supplier,
     nation, region, part
WHERE
  part.p_partkey = partsupp.ps_partkey
  AND supplier.s_suppkey = partsupp.ps_suppkey
  AND supplier.s_nationkey = nation.n_nationkey
  AND nation.n_regionkey = region.r_regionkey
  AND region.r_name = 'ASIA'
;
