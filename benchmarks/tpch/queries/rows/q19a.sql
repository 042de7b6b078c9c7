-- TPC-H Q19 (spec §2.4.19), disjunct 1 of its WHERE clause (NR §4.3.4: "three parts, once the
-- disjunctive WHERE-clause has been split", ≈ 4.2·10^5 each; Table 20: Q19a). Unchanged otherwise.
-- NR §4.3.4 (p. 246) ran the row analysis on TPC-H queries "counting the number of rows they return", in
-- the form SELECT COUNT(*) FROM T1, …, Tn WHERE condition, with SUM treated as COUNT; spec parameters.
SELECT SUM(l_extendedprice * (1 - l_discount))
FROM lineitem, part
WHERE p_partkey = l_partkey
  AND p_brand = 'Brand#12'
  AND p_container IN ('SM CASE', 'SM BOX', 'SM PACK', 'SM PKG')
  AND l_quantity >= 1 AND l_quantity <= 1 + 10
  AND p_size BETWEEN 1 AND 5
  AND l_shipmode IN ('AIR', 'AIR REG')
  AND l_shipinstruct = 'DELIVER IN PERSON';
