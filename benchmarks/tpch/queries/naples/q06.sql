-- NAPLES Q6 (NR §4.3.3.4, listing lines 107–117). NAPLES: l_shipdate >= 170.5 AND < 170.5 + 12
-- (170.5 months = day 5115 = 1994-01-02; 12 months = 360 days).
SELECT SUM(lineitem.l_extendedprice
           *lineitem.l_discount)
FROM lineitem
WHERE
  lineitem.l_shipdate >= date '1994-01-02'
  AND lineitem.l_shipdate < date '1994-01-02' + interval '360' day
  AND lineitem.l_discount BETWEEN 0.09 - 0.01
                          AND 0.09 + 0.01
  AND lineitem.l_quantity < 24
;
