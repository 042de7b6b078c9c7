-- R2T's Q3 (hkustDB/Race-to-the-Top, Query/Q3.txt): COUNT over customer ⋈ orders ⋈ lineitem; unit customer
SELECT COUNT(*) FROM customer, orders, lineitem
WHERE o_custkey = c_custkey AND l_orderkey = o_orderkey
  AND o_orderdate < date '1997-01-01' AND l_shipdate > date '1994-01-01'
