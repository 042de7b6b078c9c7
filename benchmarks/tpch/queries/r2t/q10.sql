-- R2T's Q10 (Query/Q10.txt): COUNT over orders ⋈ customer ⋈ nation; unit customer
SELECT COUNT(*) FROM orders, customer, nation WHERE c_custkey = o_custkey AND c_nationkey = n_nationkey
