-- NAPLES Q1_1 (NR §4.3.3.4, listing lines 1–8): TPC-H Q1 split into one aggregate per query.
-- NAPLES: l_shipdate <= 230.3 - 30 (dates in 30-day months since 1980-01-01: 230.3 = day 6909 =
-- 1998-12-01; 30 months = 900 days).
SELECT SUM(lineitem.l_quantity)
FROM lineitem
WHERE
  lineitem.l_shipdate <= date '1998-12-01' - interval '900' day
  AND lineitem.l_returnflag = 'R'
  AND lineitem.l_linestatus = 'F'
;
