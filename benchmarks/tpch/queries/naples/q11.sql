-- NAPLES Q11 (NR §4.3.3.4, listing lines 192–200): the total of TPC-H Q11's HAVING subquery.
SELECT SUM(partsupp.ps_supplycost
           * partsupp.ps_availqty * 0.2)
FROM partsupp, supplier, nation
WHERE
  partsupp.ps_suppkey = supplier.s_suppkey
  AND supplier.s_nationkey = nation.n_nationkey
  AND nation.n_name = 'JAPAN'
;
