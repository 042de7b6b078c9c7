-- TPC-H Q6 unchanged (spec §2.4.6): SUM(l_extendedprice * l_discount). Not in NR §4.3.4 (counts only);
-- sqldp bounds the summand by the policy's ranges (l_extendedprice ≤ 104,950, l_discount ≤ 0.10).
-- NR §4.3.4 (p. 246) ran the row analysis on TPC-H queries "counting the number of rows they return", in
-- the form SELECT COUNT(*) FROM T1, …, Tn WHERE condition, with SUM treated as COUNT; spec parameters.
SELECT SUM(l_extendedprice * l_discount)
FROM lineitem
WHERE l_shipdate >= date '1994-01-01'
  AND l_shipdate < date '1994-01-01' + interval '1' year
  AND l_discount BETWEEN 0.06 - 0.01 AND 0.06 + 0.01
  AND l_quantity < 24;
