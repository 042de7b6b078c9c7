-- TPC-H Q10 (spec §2.4.10, DATE = 1993-10-01) as a COUNT (NR Table 20: Q10). Changes: SUM(revenue) →
-- COUNT(*); GROUP BY the customer, ORDER BY and LIMIT removed.
-- NR §4.3.4 (p. 246) ran the row analysis on TPC-H queries "counting the number of rows they return", in
-- the form SELECT COUNT(*) FROM T1, …, Tn WHERE condition, with SUM treated as COUNT; spec parameters.
SELECT COUNT(*)
FROM customer, orders, lineitem, nation
WHERE c_custkey = o_custkey
  AND l_orderkey = o_orderkey
  AND o_orderdate >= date '1993-10-01'
  AND o_orderdate < date '1993-10-01' + interval '3' month
  AND l_returnflag = 'R'
  AND c_nationkey = n_nationkey;
