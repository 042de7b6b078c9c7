SELECT
  *
FROM (
  SELECT
    w_warehouse_name,
    i_item_id,
    SUM(
      CASE
        WHEN (
          CAST(d_date AS DATE) < CAST('2000-03-11' AS DATE)
        )
        THEN inv_quantity_on_hand
        ELSE 0
      END
    ) AS inv_before,
    SUM(
      CASE
        WHEN (
          CAST(d_date AS DATE) >= CAST('2000-03-11' AS DATE)
        )
        THEN inv_quantity_on_hand
        ELSE 0
      END
    ) AS inv_after
  FROM inventory, warehouse, item, date_dim
  WHERE
    i_current_price BETWEEN 0.99 AND 1.49
    AND i_item_sk = inv_item_sk
    AND inv_warehouse_sk = w_warehouse_sk
    AND inv_date_sk = d_date_sk
    AND d_date BETWEEN CAST('2000-02-10' AS DATE) AND CAST('2000-04-10' AS DATE)
  GROUP BY
    w_warehouse_name,
    i_item_id
) AS x
WHERE
  (
    CASE
      WHEN inv_before > 0
      THEN CAST((
        inv_after * 1.000
      ) AS DOUBLE PRECISION) / inv_before
      ELSE NULL
    END
  ) BETWEEN CAST(2.000 AS DOUBLE PRECISION) / 3.000 AND CAST(3.000 AS DOUBLE PRECISION) / 2.000
ORDER BY
  w_warehouse_name NULLS FIRST,
  i_item_id NULLS FIRST
LIMIT 100;
