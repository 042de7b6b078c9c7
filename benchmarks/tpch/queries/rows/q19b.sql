-- TPC-H Q19 (spec §2.4.19), disjunct 2 of its WHERE clause (NR §4.3.4: "three parts, once the
-- disjunctive WHERE-clause has been split", ≈ 4.2·10^5 each; Table 20: Q19b). Unchanged otherwise.
-- NR §4.3.4 (p. 246) ran the row analysis on TPC-H queries "counting the number of rows they return", in
-- the form SELECT COUNT(*) FROM T1, …, Tn WHERE condition, with SUM treated as COUNT; spec parameters.
SELECT SUM(l_extendedprice * (1 - l_discount))
FROM lineitem, part
WHERE p_partkey = l_partkey
  AND p_brand = 'Brand#23'
  AND p_container IN ('MED BAG', 'MED BOX', 'MED PKG', 'MED PACK')
  AND l_quantity >= 10 AND l_quantity <= 10 + 10
  AND p_size BETWEEN 1 AND 10
  AND l_shipmode IN ('AIR', 'AIR REG')
  AND l_shipinstruct = 'DELIVER IN PERSON';
