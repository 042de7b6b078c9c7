-- NAPLES Q17 (NR §4.3.3.4, listing lines 241–249): TPC-H Q17 with the correlated 0.2 · AVG(l_quantity)
-- replaced by the constant 0.2 * 32 and the yearly average by a SUM times 0.142857 = 1/7 (see the report).
-- NAPLES wrote 'JUMBO_PKG'; the generated value is 'JUMBO PKG'.
SELECT SUM(lineitem.l_extendedprice * 0.142857)
FROM lineitem, part
WHERE
  part.p_partkey = lineitem.l_partkey
  AND part.p_brand = 'Brand#34'
  AND part.p_container = 'JUMBO PKG'
  AND lineitem.l_quantity < 0.2 * 32
;
