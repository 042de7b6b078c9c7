-- TPC-H Q14 (spec §2.4.14, DATE = 1995-09-01), its first part (the PROMO numerator) as a COUNT (not in
-- Table 20). Changes: SUM(CASE WHEN p_type LIKE 'PROMO%' …) → COUNT(*) with the condition in WHERE.
-- NR §4.3.4 (p. 246) ran the row analysis on TPC-H queries "counting the number of rows they return", in
-- the form SELECT COUNT(*) FROM T1, …, Tn WHERE condition, with SUM treated as COUNT; spec parameters.
SELECT COUNT(*)
FROM lineitem, part
WHERE l_partkey = p_partkey
  AND p_type LIKE 'PROMO%'
  AND l_shipdate >= date '1995-09-01'
  AND l_shipdate < date '1995-09-01' + interval '1' month;
