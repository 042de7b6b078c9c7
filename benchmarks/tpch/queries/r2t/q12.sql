-- R2T's Q12 (Query/Q12.txt): COUNT over orders ⋈ lineitem; unit orders
SELECT COUNT(*) FROM orders, lineitem WHERE o_orderkey = l_orderkey
