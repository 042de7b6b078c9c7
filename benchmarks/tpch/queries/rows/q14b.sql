-- TPC-H Q14, its second part, the denominator sum (NR §4.3.4: "the second part of Q14", a summing query,
-- smooth sensitivity ≈ 4.5·10^5 at β = 0.1; Table 20: Q14b). Unchanged otherwise; sqldp bounds the summand
-- by the policy's ranges instead of NAPLES' assumed 1000.
-- NR §4.3.4 (p. 246) ran the row analysis on TPC-H queries "counting the number of rows they return", in
-- the form SELECT COUNT(*) FROM T1, …, Tn WHERE condition, with SUM treated as COUNT; spec parameters.
SELECT SUM(l_extendedprice * (1 - l_discount))
FROM lineitem, part
WHERE l_partkey = p_partkey
  AND l_shipdate >= date '1995-09-01'
  AND l_shipdate < date '1995-09-01' + interval '1' month;
