-- TPC-H Q17, third part (NR §4.3.4: "involves three tables, and hence has large sensitivity"; Table 20:
-- Q17c). The report does not print it; here the outer lineitem joined with the decorrelated inner lineitem
-- on the correlation key, counting pairs where the outer quantity is below a fifth of the inner one (the
-- 0.2·AVG comparison, pairwise) — a self-join of lineitem.
-- NR §4.3.4 (p. 246) ran the row analysis on TPC-H queries "counting the number of rows they return", in
-- the form SELECT COUNT(*) FROM T1, …, Tn WHERE condition, with SUM treated as COUNT; spec parameters.
SELECT COUNT(*)
FROM lineitem l1, part, lineitem l2
WHERE p_partkey = l1.l_partkey
  AND l2.l_partkey = p_partkey
  AND p_brand = 'Brand#23'
  AND p_container = 'MED BOX'
  AND 5 * l1.l_quantity < l2.l_quantity;
