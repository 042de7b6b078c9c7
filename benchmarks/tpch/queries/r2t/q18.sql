-- R2T's Q18 (Query/Q18.txt): SUM(l_quantity) over customer ⋈ orders ⋈ lineitem; unit customer
SELECT SUM(l_quantity) FROM customer, orders, lineitem WHERE c_custkey = o_custkey AND o_orderkey = l_orderkey
