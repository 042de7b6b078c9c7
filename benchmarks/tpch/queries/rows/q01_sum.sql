-- TPC-H Q1's sum_qty. Not in NR §4.3.4 (which counted only); added because sqldp sums with the
-- policy's declared range l_quantity ∈ [1, 50]. Change: GROUP BY and ORDER BY removed.
-- NR §4.3.4 (p. 246) ran the row analysis on TPC-H queries "counting the number of rows they return", in
-- the form SELECT COUNT(*) FROM T1, …, Tn WHERE condition, with SUM treated as COUNT; spec parameters.
SELECT SUM(l_quantity)
FROM lineitem
WHERE l_shipdate <= date '1998-12-01' - interval '90' day;
