-- NAPLES Q19 (NR §4.3.3.4, listing lines 250–285). NAPLES wrote values with underscores ('AIR_REG',
-- 'DELIVER_IN_PERSON', 'SM_CASE', …); the generated values have spaces. 'AIR REG' is TPC-H Q19's own text
-- (the generated mode is 'REG AIR'). The third branch (90 <= l_quantity <= 100) is kept as listed; it
-- never holds, since l_quantity is at most 50.
SELECT SUM(lineitem.l_extendedprice
           *(1-lineitem.l_discount))
FROM lineitem, part
WHERE
  part.p_partkey = lineitem.l_partkey
  AND lineitem.l_shipmode IN ('AIR', 'AIR REG')
  AND lineitem.l_shipinstruct = 'DELIVER IN PERSON'
  AND part.p_size >= 1
  AND
  ((
    part.p_brand = 'Brand#34'
    AND part.p_container IN ('SM CASE', 'SM BOX',
                             'SM PACK', 'SM PKG')
    AND lineitem.l_quantity >= 35
    AND lineitem.l_quantity <= 35 + 10
    AND part.p_size <= 5
    )
    OR
    (
    part.p_brand = 'Brand#22'
    AND part.p_container IN ('MED BAG', 'MED BOX',
                             'MED PKG', 'MED PACK')
    AND lineitem.l_quantity >= 12
    AND lineitem.l_quantity <= 12 + 10
    AND part.p_size <= 10
    )
    OR
    (
    part.p_brand = 'Brand#14'
    AND part.p_container IN ('LG CASE', 'LG BOX',
                             'LG PACK', 'LG PKG')
    AND lineitem.l_quantity >= 90
    AND lineitem.l_quantity <= 90 + 10
    AND part.p_size <= 15
));
