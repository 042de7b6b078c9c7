-- NAPLES Q16 (NR §4.3.3.4, listing lines 227–240): one group of TPC-H Q16 as a COUNT. NAPLES wrote
-- 'LARGE_ANODIZED_TIN'; the generated value is 'LARGE ANODIZED TIN'.
SELECT COUNT(partsupp.ps_suppkey)
FROM partsupp, part, supplier
WHERE
  part.p_partkey = partsupp.ps_partkey
  AND partsupp.ps_suppkey = supplier.s_suppkey
  AND part.p_brand <> 'Brand#34'
  AND NOT (part.p_type LIKE '%COPPER%')
  AND part.p_size in (5, 10, 15, 20, 25, 30, 35, 40)
  AND NOT (supplier.s_comment LIKE
                              '%Customer%Complaints%')
  AND part.p_brand = 'Brand#14'
  AND part.p_type = 'LARGE ANODIZED TIN'
;
