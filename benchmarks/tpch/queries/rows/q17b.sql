-- TPC-H Q17, second part (NR §4.3.4: "a counting query", ≈ 56; Table 20: Q17b): the inner COUNT of
-- AVG = SUM/COUNT over the outer join.
-- NR §4.3.4 (p. 246) ran the row analysis on TPC-H queries "counting the number of rows they return", in
-- the form SELECT COUNT(*) FROM T1, …, Tn WHERE condition, with SUM treated as COUNT; spec parameters.
SELECT COUNT(*)
FROM lineitem, part
WHERE p_partkey = l_partkey
  AND p_brand = 'Brand#23'
  AND p_container = 'MED BOX';
