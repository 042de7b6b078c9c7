-- TPC-H Q6 (spec §2.4.6, DATE = 1994-01-01, DISCOUNT = 0.06, QUANTITY = 24) as a COUNT: NR §4.3.4
-- names Q6 a single-table query. Change: SUM(l_extendedprice * l_discount) → COUNT(*).
-- NR §4.3.4 (p. 246) ran the row analysis on TPC-H queries "counting the number of rows they return", in
-- the form SELECT COUNT(*) FROM T1, …, Tn WHERE condition, with SUM treated as COUNT; spec parameters.
SELECT COUNT(*)
FROM lineitem
WHERE l_shipdate >= date '1994-01-01'
  AND l_shipdate < date '1994-01-01' + interval '1' year
  AND l_discount BETWEEN 0.06 - 0.01 AND 0.06 + 0.01
  AND l_quantity < 24;
