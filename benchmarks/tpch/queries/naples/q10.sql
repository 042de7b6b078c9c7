-- NAPLES Q10 (NR §4.3.3.4, listing lines 176–191). NAPLES: o_orderdate >= 183.3 AND < 183.3 + 3
-- (183.3 months = day 5499 = 1995-01-21; 3 months = 90 days). The quoted key '64' is kept (read as an integer).
SELECT SUM(lineitem.l_extendedprice
           *(1 - lineitem.l_discount))
FROM
  customer, orders,
  lineitem, nation
WHERE
  customer.c_custkey = orders.o_custkey
  AND lineitem.l_orderkey = orders.o_orderkey
  AND orders.o_orderdate >= date '1995-01-21'
  AND orders.o_orderdate < date '1995-01-21' + interval '90' day
  AND lineitem.l_returnflag = 'R'
  AND customer.c_nationkey = nation.n_nationkey
  AND customer.c_custkey = '64'
  AND nation.n_name = 'CANADA'
;
