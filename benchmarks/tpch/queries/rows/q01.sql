-- TPC-H Q1 (spec §2.4.1, DELTA = 90) as its count_order: NR §4.3.4 names Q1 a single-table query
-- ("always [has] sensitivity equal to 1"). Change: GROUP BY l_returnflag, l_linestatus and ORDER BY removed.
-- NR §4.3.4 (p. 246) ran the row analysis on TPC-H queries "counting the number of rows they return", in
-- the form SELECT COUNT(*) FROM T1, …, Tn WHERE condition, with SUM treated as COUNT; spec parameters.
SELECT COUNT(*)
FROM lineitem
WHERE l_shipdate <= date '1998-12-01' - interval '90' day;
