-- NAPLES Q5 (NR §4.3.3.4, listing lines 89–106). NAPLES: o_orderdate >= 213.3 AND < 213.3 + 12
-- (12 months = 360 days). 213.3 is printed to one decimal: day 6400 = 1997-07-10 (213.33 months)
-- reproduces NAPLES' Table 17 (5.37M at SF 0.1); day 6399 = 1997-07-09 would give 5.43M.
SELECT SUM(lineitem.l_extendedprice
           *(1-lineitem.l_discount))
FROM customer, orders,
     lineitem, supplier,
     nation, region
WHERE
  customer.c_custkey = orders.o_custkey
  AND lineitem.l_orderkey = orders.o_orderkey
  AND lineitem.l_suppkey = supplier.s_suppkey
  AND customer.c_nationkey = supplier.s_nationkey
  AND supplier.s_nationkey = nation.n_nationkey
  AND nation.n_regionkey = region.r_regionkey
  AND region.r_name = 'ASIA'
  AND orders.o_orderdate >= date '1997-07-10'
  AND orders.o_orderdate < date '1997-07-10' + interval '360' day
  AND nation.n_name = 'JAPAN'
;
