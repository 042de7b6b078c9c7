-- NAPLES Q1_2 (NR §4.3.3.4, listing lines 9–16). NAPLES: l_shipdate <= 230.3 - 30
-- (day 6909 - 900 after 1980-01-01, see q01_1.sql).
SELECT SUM(lineitem.l_extendedprice)
FROM lineitem
WHERE
  lineitem.l_shipdate <= date '1998-12-01' - interval '900' day
  AND lineitem.l_returnflag = 'R'
  AND lineitem.l_linestatus = 'F'
;
