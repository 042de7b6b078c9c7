-- TPC-H Q11 (spec §2.4.11, NATION = GERMANY) as a COUNT (NR Table 20: Q11). Changes: the HAVING
-- subquery, GROUP BY ps_partkey and ORDER BY removed; SUM(ps_supplycost * ps_availqty) → COUNT(*).
-- NR §4.3.4 (p. 246) ran the row analysis on TPC-H queries "counting the number of rows they return", in
-- the form SELECT COUNT(*) FROM T1, …, Tn WHERE condition, with SUM treated as COUNT; spec parameters.
SELECT COUNT(*)
FROM partsupp, supplier, nation
WHERE ps_suppkey = s_suppkey
  AND s_nationkey = n_nationkey
  AND n_name = 'GERMANY';
