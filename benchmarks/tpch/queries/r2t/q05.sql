-- R2T's Q5 (Query/Q5.txt, without its merged ids table): COUNT over supplier ⋈ lineitem ⋈ orders ⋈ customer ⋈
-- nation ⋈ region, local suppliers; units customer and supplier
SELECT COUNT(*) FROM supplier, lineitem, orders, customer, nation, region
WHERE s_suppkey = l_suppkey AND l_orderkey = o_orderkey AND o_custkey = c_custkey
  AND c_nationkey = n_nationkey AND n_nationkey = s_nationkey AND r_regionkey = n_regionkey
