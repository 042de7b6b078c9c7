-- TPC-H Q12, its second part low_line_count (NR §4.3.4, Table 20: Q12b). Changes as q12a.sql.
-- NR §4.3.4 (p. 246) ran the row analysis on TPC-H queries "counting the number of rows they return", in
-- the form SELECT COUNT(*) FROM T1, …, Tn WHERE condition, with SUM treated as COUNT; spec parameters.
SELECT COUNT(*)
FROM orders, lineitem
WHERE o_orderkey = l_orderkey
  AND o_orderpriority <> '1-URGENT'
  AND o_orderpriority <> '2-HIGH'
  AND l_shipmode IN ('MAIL', 'SHIP')
  AND l_commitdate < l_receiptdate
  AND l_shipdate < l_commitdate
  AND l_receiptdate >= date '1994-01-01'
  AND l_receiptdate < date '1994-01-01' + interval '1' year;
