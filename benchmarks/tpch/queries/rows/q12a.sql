-- TPC-H Q12 (spec §2.4.12, MAIL, SHIP, DATE = 1994-01-01), its first part high_line_count (NR §4.3.4:
-- "both parts of Q12", Table 20: Q12a). Changes: SUM(CASE … THEN 1 ELSE 0) → COUNT(*) with the CASE
-- condition in WHERE; GROUP BY l_shipmode and ORDER BY removed.
-- NR §4.3.4 (p. 246) ran the row analysis on TPC-H queries "counting the number of rows they return", in
-- the form SELECT COUNT(*) FROM T1, …, Tn WHERE condition, with SUM treated as COUNT; spec parameters.
SELECT COUNT(*)
FROM orders, lineitem
WHERE o_orderkey = l_orderkey
  AND (o_orderpriority = '1-URGENT' OR o_orderpriority = '2-HIGH')
  AND l_shipmode IN ('MAIL', 'SHIP')
  AND l_commitdate < l_receiptdate
  AND l_shipdate < l_commitdate
  AND l_receiptdate >= date '1994-01-01'
  AND l_receiptdate < date '1994-01-01' + interval '1' year;
