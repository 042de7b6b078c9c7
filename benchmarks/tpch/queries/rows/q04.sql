-- TPC-H Q4 (spec §2.4.4, DATE = 1993-07-01) as a COUNT over the join of orders and lineitem. Changes:
-- EXISTS replaced by the join (so it counts late lineitems of the quarter's orders, as NAPLES' Q4 of
-- §4.3.3.4 does; the row analysis has no EXISTS), GROUP BY o_orderpriority and ORDER BY removed.
-- NR §4.3.4 (p. 246) ran the row analysis on TPC-H queries "counting the number of rows they return", in
-- the form SELECT COUNT(*) FROM T1, …, Tn WHERE condition, with SUM treated as COUNT; spec parameters.
SELECT COUNT(*)
FROM orders, lineitem
WHERE o_orderkey = l_orderkey
  AND o_orderdate >= date '1993-07-01'
  AND o_orderdate < date '1993-07-01' + interval '3' month
  AND l_commitdate < l_receiptdate;
