-- TPC-H Q17 (spec §2.4.17, Brand#23, MED BOX), first part once the nested AVG is transformed out (NR
-- §4.3.4: "a summing query", ≈ 1500; Table 20: Q17a): the inner SUM(l_quantity) over the outer join.
-- NR §4.3.4 (p. 246) ran the row analysis on TPC-H queries "counting the number of rows they return", in
-- the form SELECT COUNT(*) FROM T1, …, Tn WHERE condition, with SUM treated as COUNT; spec parameters.
SELECT SUM(l_quantity)
FROM lineitem, part
WHERE p_partkey = l_partkey
  AND p_brand = 'Brand#23'
  AND p_container = 'MED BOX';
