-- TPC-H Q19 (spec §2.4.19), disjunct 3 of its WHERE clause (NR §4.3.4: "three parts, once the
-- disjunctive WHERE-clause has been split", ≈ 4.2·10^5 each; Table 20: Q19c). Unchanged otherwise.
-- NR §4.3.4 (p. 246) ran the row analysis on TPC-H queries "counting the number of rows they return", in
-- the form SELECT COUNT(*) FROM T1, …, Tn WHERE condition, with SUM treated as COUNT; spec parameters.
SELECT SUM(l_extendedprice * (1 - l_discount))
FROM lineitem, part
WHERE p_partkey = l_partkey
  AND p_brand = 'Brand#34'
  AND p_container IN ('LG CASE', 'LG BOX', 'LG PACK', 'LG PKG')
  AND l_quantity >= 20 AND l_quantity <= 20 + 10
  AND p_size BETWEEN 1 AND 15
  AND l_shipmode IN ('AIR', 'AIR REG')
  AND l_shipinstruct = 'DELIVER IN PERSON';
