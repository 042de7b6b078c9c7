-- TPC-DS schema (TPC-DS Standard Specification, chapter 2: the 7 fact and 17 dimension tables, their
-- primary keys and foreign keys), for the data DuckDB's tpcds extension generates (`CALL dsdgen(sf=S)`,
-- the spec's dsdgen in-process). Loaded by `sqldp load tpcds` (sqldp.datasets.load_tpcds).
--
-- Types. Column names and order are dsdgen's. Identifiers and integers are INTEGER (the spec's
-- "identifier" and "integer"; the largest, ss_ticket_number, stays far below 2^31 at SF ≤ 100), decimals
-- keep the spec's DECIMAL(7,2) / DECIMAL(5,2) / DECIMAL(15,2), dates are DATE. The spec's char(N) and
-- varchar(N) are VARCHAR: the generated text carries no padding, and VARCHAR compares it as generated
-- (CHAR(N) would pad, which changes what `=` and a GROUP BY see, docs/policy.md "Groups").
--
-- NULL. Only the primary-key columns are NOT NULL: dsdgen leaves a small share of every other column
-- NULL (the spec declares only the keys NOT NULL), so the loader's COPY reads an empty field as NULL.
--
-- Keys. Every surrogate key (`*_sk`) that is not its table's own key references the dimension its name
-- says (`*_date_sk` date_dim, `*_time_sk` time_dim, `*_customer_sk` customer, `*_cdemo_sk`
-- customer_demographics, `*_hdemo_sk` household_demographics, `*_addr_sk` customer_address, …), and
-- each return references the sale it returns (sr_item_sk, sr_ticket_number → store_sales; catalog and
-- web returns by item and order number). The generated data satisfies all of them at SF 0.01 and 0.1
-- (PostgreSQL validates each one after the data is in). Foreign keys and indexes come last so that the
-- loader can COPY first and validate each key once.

CREATE TABLE call_center (
    cc_call_center_sk  INTEGER NOT NULL,
    cc_call_center_id  VARCHAR,
    cc_rec_start_date  DATE,
    cc_rec_end_date    DATE,
    cc_closed_date_sk  INTEGER,
    cc_open_date_sk    INTEGER,
    cc_name            VARCHAR,
    cc_class           VARCHAR,
    cc_employees       INTEGER,
    cc_sq_ft           INTEGER,
    cc_hours           VARCHAR,
    cc_manager         VARCHAR,
    cc_mkt_id          INTEGER,
    cc_mkt_class       VARCHAR,
    cc_mkt_desc        VARCHAR,
    cc_market_manager  VARCHAR,
    cc_division        INTEGER,
    cc_division_name   VARCHAR,
    cc_company         INTEGER,
    cc_company_name    VARCHAR,
    cc_street_number   VARCHAR,
    cc_street_name     VARCHAR,
    cc_street_type     VARCHAR,
    cc_suite_number    VARCHAR,
    cc_city            VARCHAR,
    cc_county          VARCHAR,
    cc_state           VARCHAR,
    cc_zip             VARCHAR,
    cc_country         VARCHAR,
    cc_gmt_offset      DECIMAL(5,2),
    cc_tax_percentage  DECIMAL(5,2),
    PRIMARY KEY (cc_call_center_sk)
);
CREATE TABLE catalog_page (
    cp_catalog_page_sk      INTEGER NOT NULL,
    cp_catalog_page_id      VARCHAR,
    cp_start_date_sk        INTEGER,
    cp_end_date_sk          INTEGER,
    cp_department           VARCHAR,
    cp_catalog_number       INTEGER,
    cp_catalog_page_number  INTEGER,
    cp_description          VARCHAR,
    cp_type                 VARCHAR,
    PRIMARY KEY (cp_catalog_page_sk)
);
CREATE TABLE catalog_returns (
    cr_returned_date_sk       INTEGER,
    cr_returned_time_sk       INTEGER,
    cr_item_sk                INTEGER NOT NULL,
    cr_refunded_customer_sk   INTEGER,
    cr_refunded_cdemo_sk      INTEGER,
    cr_refunded_hdemo_sk      INTEGER,
    cr_refunded_addr_sk       INTEGER,
    cr_returning_customer_sk  INTEGER,
    cr_returning_cdemo_sk     INTEGER,
    cr_returning_hdemo_sk     INTEGER,
    cr_returning_addr_sk      INTEGER,
    cr_call_center_sk         INTEGER,
    cr_catalog_page_sk        INTEGER,
    cr_ship_mode_sk           INTEGER,
    cr_warehouse_sk           INTEGER,
    cr_reason_sk              INTEGER,
    cr_order_number           INTEGER NOT NULL,
    cr_return_quantity        INTEGER,
    cr_return_amount          DECIMAL(7,2),
    cr_return_tax             DECIMAL(7,2),
    cr_return_amt_inc_tax     DECIMAL(7,2),
    cr_fee                    DECIMAL(7,2),
    cr_return_ship_cost       DECIMAL(7,2),
    cr_refunded_cash          DECIMAL(7,2),
    cr_reversed_charge        DECIMAL(7,2),
    cr_store_credit           DECIMAL(7,2),
    cr_net_loss               DECIMAL(7,2),
    PRIMARY KEY (cr_item_sk, cr_order_number)
);
CREATE TABLE catalog_sales (
    cs_sold_date_sk           INTEGER,
    cs_sold_time_sk           INTEGER,
    cs_ship_date_sk           INTEGER,
    cs_bill_customer_sk       INTEGER,
    cs_bill_cdemo_sk          INTEGER,
    cs_bill_hdemo_sk          INTEGER,
    cs_bill_addr_sk           INTEGER,
    cs_ship_customer_sk       INTEGER,
    cs_ship_cdemo_sk          INTEGER,
    cs_ship_hdemo_sk          INTEGER,
    cs_ship_addr_sk           INTEGER,
    cs_call_center_sk         INTEGER,
    cs_catalog_page_sk        INTEGER,
    cs_ship_mode_sk           INTEGER,
    cs_warehouse_sk           INTEGER,
    cs_item_sk                INTEGER NOT NULL,
    cs_promo_sk               INTEGER,
    cs_order_number           INTEGER NOT NULL,
    cs_quantity               INTEGER,
    cs_wholesale_cost         DECIMAL(7,2),
    cs_list_price             DECIMAL(7,2),
    cs_sales_price            DECIMAL(7,2),
    cs_ext_discount_amt       DECIMAL(7,2),
    cs_ext_sales_price        DECIMAL(7,2),
    cs_ext_wholesale_cost     DECIMAL(7,2),
    cs_ext_list_price         DECIMAL(7,2),
    cs_ext_tax                DECIMAL(7,2),
    cs_coupon_amt             DECIMAL(7,2),
    cs_ext_ship_cost          DECIMAL(7,2),
    cs_net_paid               DECIMAL(7,2),
    cs_net_paid_inc_tax       DECIMAL(7,2),
    cs_net_paid_inc_ship      DECIMAL(7,2),
    cs_net_paid_inc_ship_tax  DECIMAL(7,2),
    cs_net_profit             DECIMAL(7,2),
    PRIMARY KEY (cs_item_sk, cs_order_number)
);
CREATE TABLE customer (
    c_customer_sk           INTEGER NOT NULL,
    c_customer_id           VARCHAR,
    c_current_cdemo_sk      INTEGER,
    c_current_hdemo_sk      INTEGER,
    c_current_addr_sk       INTEGER,
    c_first_shipto_date_sk  INTEGER,
    c_first_sales_date_sk   INTEGER,
    c_salutation            VARCHAR,
    c_first_name            VARCHAR,
    c_last_name             VARCHAR,
    c_preferred_cust_flag   VARCHAR,
    c_birth_day             INTEGER,
    c_birth_month           INTEGER,
    c_birth_year            INTEGER,
    c_birth_country         VARCHAR,
    c_login                 VARCHAR,
    c_email_address         VARCHAR,
    c_last_review_date_sk   INTEGER,
    PRIMARY KEY (c_customer_sk)
);
CREATE TABLE customer_address (
    ca_address_sk     INTEGER NOT NULL,
    ca_address_id     VARCHAR,
    ca_street_number  VARCHAR,
    ca_street_name    VARCHAR,
    ca_street_type    VARCHAR,
    ca_suite_number   VARCHAR,
    ca_city           VARCHAR,
    ca_county         VARCHAR,
    ca_state          VARCHAR,
    ca_zip            VARCHAR,
    ca_country        VARCHAR,
    ca_gmt_offset     DECIMAL(5,2),
    ca_location_type  VARCHAR,
    PRIMARY KEY (ca_address_sk)
);
CREATE TABLE customer_demographics (
    cd_demo_sk             INTEGER NOT NULL,
    cd_gender              VARCHAR,
    cd_marital_status      VARCHAR,
    cd_education_status    VARCHAR,
    cd_purchase_estimate   INTEGER,
    cd_credit_rating       VARCHAR,
    cd_dep_count           INTEGER,
    cd_dep_employed_count  INTEGER,
    cd_dep_college_count   INTEGER,
    PRIMARY KEY (cd_demo_sk)
);
CREATE TABLE date_dim (
    d_date_sk            INTEGER NOT NULL,
    d_date_id            VARCHAR,
    d_date               DATE,
    d_month_seq          INTEGER,
    d_week_seq           INTEGER,
    d_quarter_seq        INTEGER,
    d_year               INTEGER,
    d_dow                INTEGER,
    d_moy                INTEGER,
    d_dom                INTEGER,
    d_qoy                INTEGER,
    d_fy_year            INTEGER,
    d_fy_quarter_seq     INTEGER,
    d_fy_week_seq        INTEGER,
    d_day_name           VARCHAR,
    d_quarter_name       VARCHAR,
    d_holiday            VARCHAR,
    d_weekend            VARCHAR,
    d_following_holiday  VARCHAR,
    d_first_dom          INTEGER,
    d_last_dom           INTEGER,
    d_same_day_ly        INTEGER,
    d_same_day_lq        INTEGER,
    d_current_day        VARCHAR,
    d_current_week       VARCHAR,
    d_current_month      VARCHAR,
    d_current_quarter    VARCHAR,
    d_current_year       VARCHAR,
    PRIMARY KEY (d_date_sk)
);
CREATE TABLE household_demographics (
    hd_demo_sk         INTEGER NOT NULL,
    hd_income_band_sk  INTEGER,
    hd_buy_potential   VARCHAR,
    hd_dep_count       INTEGER,
    hd_vehicle_count   INTEGER,
    PRIMARY KEY (hd_demo_sk)
);
CREATE TABLE income_band (
    ib_income_band_sk  INTEGER NOT NULL,
    ib_lower_bound     INTEGER,
    ib_upper_bound     INTEGER,
    PRIMARY KEY (ib_income_band_sk)
);
CREATE TABLE inventory (
    inv_date_sk           INTEGER NOT NULL,
    inv_item_sk           INTEGER NOT NULL,
    inv_warehouse_sk      INTEGER NOT NULL,
    inv_quantity_on_hand  INTEGER,
    PRIMARY KEY (inv_date_sk, inv_item_sk, inv_warehouse_sk)
);
CREATE TABLE item (
    i_item_sk         INTEGER NOT NULL,
    i_item_id         VARCHAR,
    i_rec_start_date  DATE,
    i_rec_end_date    DATE,
    i_item_desc       VARCHAR,
    i_current_price   DECIMAL(7,2),
    i_wholesale_cost  DECIMAL(7,2),
    i_brand_id        INTEGER,
    i_brand           VARCHAR,
    i_class_id        INTEGER,
    i_class           VARCHAR,
    i_category_id     INTEGER,
    i_category        VARCHAR,
    i_manufact_id     INTEGER,
    i_manufact        VARCHAR,
    i_size            VARCHAR,
    i_formulation     VARCHAR,
    i_color           VARCHAR,
    i_units           VARCHAR,
    i_container       VARCHAR,
    i_manager_id      INTEGER,
    i_product_name    VARCHAR,
    PRIMARY KEY (i_item_sk)
);
CREATE TABLE promotion (
    p_promo_sk         INTEGER NOT NULL,
    p_promo_id         VARCHAR,
    p_start_date_sk    INTEGER,
    p_end_date_sk      INTEGER,
    p_item_sk          INTEGER,
    p_cost             DECIMAL(15,2),
    p_response_target  INTEGER,
    p_promo_name       VARCHAR,
    p_channel_dmail    VARCHAR,
    p_channel_email    VARCHAR,
    p_channel_catalog  VARCHAR,
    p_channel_tv       VARCHAR,
    p_channel_radio    VARCHAR,
    p_channel_press    VARCHAR,
    p_channel_event    VARCHAR,
    p_channel_demo     VARCHAR,
    p_channel_details  VARCHAR,
    p_purpose          VARCHAR,
    p_discount_active  VARCHAR,
    PRIMARY KEY (p_promo_sk)
);
CREATE TABLE reason (
    r_reason_sk    INTEGER NOT NULL,
    r_reason_id    VARCHAR,
    r_reason_desc  VARCHAR,
    PRIMARY KEY (r_reason_sk)
);
CREATE TABLE ship_mode (
    sm_ship_mode_sk  INTEGER NOT NULL,
    sm_ship_mode_id  VARCHAR,
    sm_type          VARCHAR,
    sm_code          VARCHAR,
    sm_carrier       VARCHAR,
    sm_contract      VARCHAR,
    PRIMARY KEY (sm_ship_mode_sk)
);
CREATE TABLE store (
    s_store_sk          INTEGER NOT NULL,
    s_store_id          VARCHAR,
    s_rec_start_date    DATE,
    s_rec_end_date      DATE,
    s_closed_date_sk    INTEGER,
    s_store_name        VARCHAR,
    s_number_employees  INTEGER,
    s_floor_space       INTEGER,
    s_hours             VARCHAR,
    s_manager           VARCHAR,
    s_market_id         INTEGER,
    s_geography_class   VARCHAR,
    s_market_desc       VARCHAR,
    s_market_manager    VARCHAR,
    s_division_id       INTEGER,
    s_division_name     VARCHAR,
    s_company_id        INTEGER,
    s_company_name      VARCHAR,
    s_street_number     VARCHAR,
    s_street_name       VARCHAR,
    s_street_type       VARCHAR,
    s_suite_number      VARCHAR,
    s_city              VARCHAR,
    s_county            VARCHAR,
    s_state             VARCHAR,
    s_zip               VARCHAR,
    s_country           VARCHAR,
    s_gmt_offset        DECIMAL(5,2),
    s_tax_percentage    DECIMAL(5,2),
    PRIMARY KEY (s_store_sk)
);
CREATE TABLE store_returns (
    sr_returned_date_sk    INTEGER,
    sr_return_time_sk      INTEGER,
    sr_item_sk             INTEGER NOT NULL,
    sr_customer_sk         INTEGER,
    sr_cdemo_sk            INTEGER,
    sr_hdemo_sk            INTEGER,
    sr_addr_sk             INTEGER,
    sr_store_sk            INTEGER,
    sr_reason_sk           INTEGER,
    sr_ticket_number       INTEGER NOT NULL,
    sr_return_quantity     INTEGER,
    sr_return_amt          DECIMAL(7,2),
    sr_return_tax          DECIMAL(7,2),
    sr_return_amt_inc_tax  DECIMAL(7,2),
    sr_fee                 DECIMAL(7,2),
    sr_return_ship_cost    DECIMAL(7,2),
    sr_refunded_cash       DECIMAL(7,2),
    sr_reversed_charge     DECIMAL(7,2),
    sr_store_credit        DECIMAL(7,2),
    sr_net_loss            DECIMAL(7,2),
    PRIMARY KEY (sr_item_sk, sr_ticket_number)
);
CREATE TABLE store_sales (
    ss_sold_date_sk        INTEGER,
    ss_sold_time_sk        INTEGER,
    ss_item_sk             INTEGER NOT NULL,
    ss_customer_sk         INTEGER,
    ss_cdemo_sk            INTEGER,
    ss_hdemo_sk            INTEGER,
    ss_addr_sk             INTEGER,
    ss_store_sk            INTEGER,
    ss_promo_sk            INTEGER,
    ss_ticket_number       INTEGER NOT NULL,
    ss_quantity            INTEGER,
    ss_wholesale_cost      DECIMAL(7,2),
    ss_list_price          DECIMAL(7,2),
    ss_sales_price         DECIMAL(7,2),
    ss_ext_discount_amt    DECIMAL(7,2),
    ss_ext_sales_price     DECIMAL(7,2),
    ss_ext_wholesale_cost  DECIMAL(7,2),
    ss_ext_list_price      DECIMAL(7,2),
    ss_ext_tax             DECIMAL(7,2),
    ss_coupon_amt          DECIMAL(7,2),
    ss_net_paid            DECIMAL(7,2),
    ss_net_paid_inc_tax    DECIMAL(7,2),
    ss_net_profit          DECIMAL(7,2),
    PRIMARY KEY (ss_item_sk, ss_ticket_number)
);
CREATE TABLE time_dim (
    t_time_sk    INTEGER NOT NULL,
    t_time_id    VARCHAR,
    t_time       INTEGER,
    t_hour       INTEGER,
    t_minute     INTEGER,
    t_second     INTEGER,
    t_am_pm      VARCHAR,
    t_shift      VARCHAR,
    t_sub_shift  VARCHAR,
    t_meal_time  VARCHAR,
    PRIMARY KEY (t_time_sk)
);
CREATE TABLE warehouse (
    w_warehouse_sk     INTEGER NOT NULL,
    w_warehouse_id     VARCHAR,
    w_warehouse_name   VARCHAR,
    w_warehouse_sq_ft  INTEGER,
    w_street_number    VARCHAR,
    w_street_name      VARCHAR,
    w_street_type      VARCHAR,
    w_suite_number     VARCHAR,
    w_city             VARCHAR,
    w_county           VARCHAR,
    w_state            VARCHAR,
    w_zip              VARCHAR,
    w_country          VARCHAR,
    w_gmt_offset       DECIMAL(5,2),
    PRIMARY KEY (w_warehouse_sk)
);
CREATE TABLE web_page (
    wp_web_page_sk       INTEGER NOT NULL,
    wp_web_page_id       VARCHAR,
    wp_rec_start_date    DATE,
    wp_rec_end_date      DATE,
    wp_creation_date_sk  INTEGER,
    wp_access_date_sk    INTEGER,
    wp_autogen_flag      VARCHAR,
    wp_customer_sk       INTEGER,
    wp_url               VARCHAR,
    wp_type              VARCHAR,
    wp_char_count        INTEGER,
    wp_link_count        INTEGER,
    wp_image_count       INTEGER,
    wp_max_ad_count      INTEGER,
    PRIMARY KEY (wp_web_page_sk)
);
CREATE TABLE web_returns (
    wr_returned_date_sk       INTEGER,
    wr_returned_time_sk       INTEGER,
    wr_item_sk                INTEGER NOT NULL,
    wr_refunded_customer_sk   INTEGER,
    wr_refunded_cdemo_sk      INTEGER,
    wr_refunded_hdemo_sk      INTEGER,
    wr_refunded_addr_sk       INTEGER,
    wr_returning_customer_sk  INTEGER,
    wr_returning_cdemo_sk     INTEGER,
    wr_returning_hdemo_sk     INTEGER,
    wr_returning_addr_sk      INTEGER,
    wr_web_page_sk            INTEGER,
    wr_reason_sk              INTEGER,
    wr_order_number           INTEGER NOT NULL,
    wr_return_quantity        INTEGER,
    wr_return_amt             DECIMAL(7,2),
    wr_return_tax             DECIMAL(7,2),
    wr_return_amt_inc_tax     DECIMAL(7,2),
    wr_fee                    DECIMAL(7,2),
    wr_return_ship_cost       DECIMAL(7,2),
    wr_refunded_cash          DECIMAL(7,2),
    wr_reversed_charge        DECIMAL(7,2),
    wr_account_credit         DECIMAL(7,2),
    wr_net_loss               DECIMAL(7,2),
    PRIMARY KEY (wr_item_sk, wr_order_number)
);
CREATE TABLE web_sales (
    ws_sold_date_sk           INTEGER,
    ws_sold_time_sk           INTEGER,
    ws_ship_date_sk           INTEGER,
    ws_item_sk                INTEGER NOT NULL,
    ws_bill_customer_sk       INTEGER,
    ws_bill_cdemo_sk          INTEGER,
    ws_bill_hdemo_sk          INTEGER,
    ws_bill_addr_sk           INTEGER,
    ws_ship_customer_sk       INTEGER,
    ws_ship_cdemo_sk          INTEGER,
    ws_ship_hdemo_sk          INTEGER,
    ws_ship_addr_sk           INTEGER,
    ws_web_page_sk            INTEGER,
    ws_web_site_sk            INTEGER,
    ws_ship_mode_sk           INTEGER,
    ws_warehouse_sk           INTEGER,
    ws_promo_sk               INTEGER,
    ws_order_number           INTEGER NOT NULL,
    ws_quantity               INTEGER,
    ws_wholesale_cost         DECIMAL(7,2),
    ws_list_price             DECIMAL(7,2),
    ws_sales_price            DECIMAL(7,2),
    ws_ext_discount_amt       DECIMAL(7,2),
    ws_ext_sales_price        DECIMAL(7,2),
    ws_ext_wholesale_cost     DECIMAL(7,2),
    ws_ext_list_price         DECIMAL(7,2),
    ws_ext_tax                DECIMAL(7,2),
    ws_coupon_amt             DECIMAL(7,2),
    ws_ext_ship_cost          DECIMAL(7,2),
    ws_net_paid               DECIMAL(7,2),
    ws_net_paid_inc_tax       DECIMAL(7,2),
    ws_net_paid_inc_ship      DECIMAL(7,2),
    ws_net_paid_inc_ship_tax  DECIMAL(7,2),
    ws_net_profit             DECIMAL(7,2),
    PRIMARY KEY (ws_item_sk, ws_order_number)
);
CREATE TABLE web_site (
    web_site_sk         INTEGER NOT NULL,
    web_site_id         VARCHAR,
    web_rec_start_date  DATE,
    web_rec_end_date    DATE,
    web_name            VARCHAR,
    web_open_date_sk    INTEGER,
    web_close_date_sk   INTEGER,
    web_class           VARCHAR,
    web_manager         VARCHAR,
    web_mkt_id          INTEGER,
    web_mkt_class       VARCHAR,
    web_mkt_desc        VARCHAR,
    web_market_manager  VARCHAR,
    web_company_id      INTEGER,
    web_company_name    VARCHAR,
    web_street_number   VARCHAR,
    web_street_name     VARCHAR,
    web_street_type     VARCHAR,
    web_suite_number    VARCHAR,
    web_city            VARCHAR,
    web_county          VARCHAR,
    web_state           VARCHAR,
    web_zip             VARCHAR,
    web_country         VARCHAR,
    web_gmt_offset      DECIMAL(5,2),
    web_tax_percentage  DECIMAL(5,2),
    PRIMARY KEY (web_site_sk)
);

-- Foreign keys (spec chapter 2).
ALTER TABLE call_center ADD FOREIGN KEY (cc_closed_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE call_center ADD FOREIGN KEY (cc_open_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE catalog_page ADD FOREIGN KEY (cp_start_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE catalog_page ADD FOREIGN KEY (cp_end_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE catalog_returns ADD FOREIGN KEY (cr_returned_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE catalog_returns ADD FOREIGN KEY (cr_returned_time_sk) REFERENCES time_dim (t_time_sk);
ALTER TABLE catalog_returns ADD FOREIGN KEY (cr_item_sk) REFERENCES item (i_item_sk);
ALTER TABLE catalog_returns ADD FOREIGN KEY (cr_refunded_customer_sk) REFERENCES customer (c_customer_sk);
ALTER TABLE catalog_returns ADD FOREIGN KEY (cr_refunded_cdemo_sk) REFERENCES customer_demographics (cd_demo_sk);
ALTER TABLE catalog_returns ADD FOREIGN KEY (cr_refunded_hdemo_sk) REFERENCES household_demographics (hd_demo_sk);
ALTER TABLE catalog_returns ADD FOREIGN KEY (cr_refunded_addr_sk) REFERENCES customer_address (ca_address_sk);
ALTER TABLE catalog_returns ADD FOREIGN KEY (cr_returning_customer_sk) REFERENCES customer (c_customer_sk);
ALTER TABLE catalog_returns ADD FOREIGN KEY (cr_returning_cdemo_sk) REFERENCES customer_demographics (cd_demo_sk);
ALTER TABLE catalog_returns ADD FOREIGN KEY (cr_returning_hdemo_sk) REFERENCES household_demographics (hd_demo_sk);
ALTER TABLE catalog_returns ADD FOREIGN KEY (cr_returning_addr_sk) REFERENCES customer_address (ca_address_sk);
ALTER TABLE catalog_returns ADD FOREIGN KEY (cr_call_center_sk) REFERENCES call_center (cc_call_center_sk);
ALTER TABLE catalog_returns ADD FOREIGN KEY (cr_catalog_page_sk) REFERENCES catalog_page (cp_catalog_page_sk);
ALTER TABLE catalog_returns ADD FOREIGN KEY (cr_ship_mode_sk) REFERENCES ship_mode (sm_ship_mode_sk);
ALTER TABLE catalog_returns ADD FOREIGN KEY (cr_warehouse_sk) REFERENCES warehouse (w_warehouse_sk);
ALTER TABLE catalog_returns ADD FOREIGN KEY (cr_reason_sk) REFERENCES reason (r_reason_sk);
ALTER TABLE catalog_sales ADD FOREIGN KEY (cs_sold_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE catalog_sales ADD FOREIGN KEY (cs_sold_time_sk) REFERENCES time_dim (t_time_sk);
ALTER TABLE catalog_sales ADD FOREIGN KEY (cs_ship_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE catalog_sales ADD FOREIGN KEY (cs_bill_customer_sk) REFERENCES customer (c_customer_sk);
ALTER TABLE catalog_sales ADD FOREIGN KEY (cs_bill_cdemo_sk) REFERENCES customer_demographics (cd_demo_sk);
ALTER TABLE catalog_sales ADD FOREIGN KEY (cs_bill_hdemo_sk) REFERENCES household_demographics (hd_demo_sk);
ALTER TABLE catalog_sales ADD FOREIGN KEY (cs_bill_addr_sk) REFERENCES customer_address (ca_address_sk);
ALTER TABLE catalog_sales ADD FOREIGN KEY (cs_ship_customer_sk) REFERENCES customer (c_customer_sk);
ALTER TABLE catalog_sales ADD FOREIGN KEY (cs_ship_cdemo_sk) REFERENCES customer_demographics (cd_demo_sk);
ALTER TABLE catalog_sales ADD FOREIGN KEY (cs_ship_hdemo_sk) REFERENCES household_demographics (hd_demo_sk);
ALTER TABLE catalog_sales ADD FOREIGN KEY (cs_ship_addr_sk) REFERENCES customer_address (ca_address_sk);
ALTER TABLE catalog_sales ADD FOREIGN KEY (cs_call_center_sk) REFERENCES call_center (cc_call_center_sk);
ALTER TABLE catalog_sales ADD FOREIGN KEY (cs_catalog_page_sk) REFERENCES catalog_page (cp_catalog_page_sk);
ALTER TABLE catalog_sales ADD FOREIGN KEY (cs_ship_mode_sk) REFERENCES ship_mode (sm_ship_mode_sk);
ALTER TABLE catalog_sales ADD FOREIGN KEY (cs_warehouse_sk) REFERENCES warehouse (w_warehouse_sk);
ALTER TABLE catalog_sales ADD FOREIGN KEY (cs_item_sk) REFERENCES item (i_item_sk);
ALTER TABLE catalog_sales ADD FOREIGN KEY (cs_promo_sk) REFERENCES promotion (p_promo_sk);
ALTER TABLE customer ADD FOREIGN KEY (c_current_cdemo_sk) REFERENCES customer_demographics (cd_demo_sk);
ALTER TABLE customer ADD FOREIGN KEY (c_current_hdemo_sk) REFERENCES household_demographics (hd_demo_sk);
ALTER TABLE customer ADD FOREIGN KEY (c_current_addr_sk) REFERENCES customer_address (ca_address_sk);
ALTER TABLE customer ADD FOREIGN KEY (c_first_shipto_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE customer ADD FOREIGN KEY (c_first_sales_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE customer ADD FOREIGN KEY (c_last_review_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE household_demographics ADD FOREIGN KEY (hd_income_band_sk) REFERENCES income_band (ib_income_band_sk);
ALTER TABLE inventory ADD FOREIGN KEY (inv_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE inventory ADD FOREIGN KEY (inv_item_sk) REFERENCES item (i_item_sk);
ALTER TABLE inventory ADD FOREIGN KEY (inv_warehouse_sk) REFERENCES warehouse (w_warehouse_sk);
ALTER TABLE promotion ADD FOREIGN KEY (p_start_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE promotion ADD FOREIGN KEY (p_end_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE promotion ADD FOREIGN KEY (p_item_sk) REFERENCES item (i_item_sk);
ALTER TABLE store ADD FOREIGN KEY (s_closed_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE store_returns ADD FOREIGN KEY (sr_returned_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE store_returns ADD FOREIGN KEY (sr_return_time_sk) REFERENCES time_dim (t_time_sk);
ALTER TABLE store_returns ADD FOREIGN KEY (sr_item_sk) REFERENCES item (i_item_sk);
ALTER TABLE store_returns ADD FOREIGN KEY (sr_customer_sk) REFERENCES customer (c_customer_sk);
ALTER TABLE store_returns ADD FOREIGN KEY (sr_cdemo_sk) REFERENCES customer_demographics (cd_demo_sk);
ALTER TABLE store_returns ADD FOREIGN KEY (sr_hdemo_sk) REFERENCES household_demographics (hd_demo_sk);
ALTER TABLE store_returns ADD FOREIGN KEY (sr_addr_sk) REFERENCES customer_address (ca_address_sk);
ALTER TABLE store_returns ADD FOREIGN KEY (sr_store_sk) REFERENCES store (s_store_sk);
ALTER TABLE store_returns ADD FOREIGN KEY (sr_reason_sk) REFERENCES reason (r_reason_sk);
ALTER TABLE store_sales ADD FOREIGN KEY (ss_sold_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE store_sales ADD FOREIGN KEY (ss_sold_time_sk) REFERENCES time_dim (t_time_sk);
ALTER TABLE store_sales ADD FOREIGN KEY (ss_item_sk) REFERENCES item (i_item_sk);
ALTER TABLE store_sales ADD FOREIGN KEY (ss_customer_sk) REFERENCES customer (c_customer_sk);
ALTER TABLE store_sales ADD FOREIGN KEY (ss_cdemo_sk) REFERENCES customer_demographics (cd_demo_sk);
ALTER TABLE store_sales ADD FOREIGN KEY (ss_hdemo_sk) REFERENCES household_demographics (hd_demo_sk);
ALTER TABLE store_sales ADD FOREIGN KEY (ss_addr_sk) REFERENCES customer_address (ca_address_sk);
ALTER TABLE store_sales ADD FOREIGN KEY (ss_store_sk) REFERENCES store (s_store_sk);
ALTER TABLE store_sales ADD FOREIGN KEY (ss_promo_sk) REFERENCES promotion (p_promo_sk);
ALTER TABLE web_page ADD FOREIGN KEY (wp_creation_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE web_page ADD FOREIGN KEY (wp_access_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE web_page ADD FOREIGN KEY (wp_customer_sk) REFERENCES customer (c_customer_sk);
ALTER TABLE web_returns ADD FOREIGN KEY (wr_returned_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE web_returns ADD FOREIGN KEY (wr_returned_time_sk) REFERENCES time_dim (t_time_sk);
ALTER TABLE web_returns ADD FOREIGN KEY (wr_item_sk) REFERENCES item (i_item_sk);
ALTER TABLE web_returns ADD FOREIGN KEY (wr_refunded_customer_sk) REFERENCES customer (c_customer_sk);
ALTER TABLE web_returns ADD FOREIGN KEY (wr_refunded_cdemo_sk) REFERENCES customer_demographics (cd_demo_sk);
ALTER TABLE web_returns ADD FOREIGN KEY (wr_refunded_hdemo_sk) REFERENCES household_demographics (hd_demo_sk);
ALTER TABLE web_returns ADD FOREIGN KEY (wr_refunded_addr_sk) REFERENCES customer_address (ca_address_sk);
ALTER TABLE web_returns ADD FOREIGN KEY (wr_returning_customer_sk) REFERENCES customer (c_customer_sk);
ALTER TABLE web_returns ADD FOREIGN KEY (wr_returning_cdemo_sk) REFERENCES customer_demographics (cd_demo_sk);
ALTER TABLE web_returns ADD FOREIGN KEY (wr_returning_hdemo_sk) REFERENCES household_demographics (hd_demo_sk);
ALTER TABLE web_returns ADD FOREIGN KEY (wr_returning_addr_sk) REFERENCES customer_address (ca_address_sk);
ALTER TABLE web_returns ADD FOREIGN KEY (wr_web_page_sk) REFERENCES web_page (wp_web_page_sk);
ALTER TABLE web_returns ADD FOREIGN KEY (wr_reason_sk) REFERENCES reason (r_reason_sk);
ALTER TABLE web_sales ADD FOREIGN KEY (ws_sold_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE web_sales ADD FOREIGN KEY (ws_sold_time_sk) REFERENCES time_dim (t_time_sk);
ALTER TABLE web_sales ADD FOREIGN KEY (ws_ship_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE web_sales ADD FOREIGN KEY (ws_item_sk) REFERENCES item (i_item_sk);
ALTER TABLE web_sales ADD FOREIGN KEY (ws_bill_customer_sk) REFERENCES customer (c_customer_sk);
ALTER TABLE web_sales ADD FOREIGN KEY (ws_bill_cdemo_sk) REFERENCES customer_demographics (cd_demo_sk);
ALTER TABLE web_sales ADD FOREIGN KEY (ws_bill_hdemo_sk) REFERENCES household_demographics (hd_demo_sk);
ALTER TABLE web_sales ADD FOREIGN KEY (ws_bill_addr_sk) REFERENCES customer_address (ca_address_sk);
ALTER TABLE web_sales ADD FOREIGN KEY (ws_ship_customer_sk) REFERENCES customer (c_customer_sk);
ALTER TABLE web_sales ADD FOREIGN KEY (ws_ship_cdemo_sk) REFERENCES customer_demographics (cd_demo_sk);
ALTER TABLE web_sales ADD FOREIGN KEY (ws_ship_hdemo_sk) REFERENCES household_demographics (hd_demo_sk);
ALTER TABLE web_sales ADD FOREIGN KEY (ws_ship_addr_sk) REFERENCES customer_address (ca_address_sk);
ALTER TABLE web_sales ADD FOREIGN KEY (ws_web_page_sk) REFERENCES web_page (wp_web_page_sk);
ALTER TABLE web_sales ADD FOREIGN KEY (ws_web_site_sk) REFERENCES web_site (web_site_sk);
ALTER TABLE web_sales ADD FOREIGN KEY (ws_ship_mode_sk) REFERENCES ship_mode (sm_ship_mode_sk);
ALTER TABLE web_sales ADD FOREIGN KEY (ws_warehouse_sk) REFERENCES warehouse (w_warehouse_sk);
ALTER TABLE web_sales ADD FOREIGN KEY (ws_promo_sk) REFERENCES promotion (p_promo_sk);
ALTER TABLE web_site ADD FOREIGN KEY (web_open_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE web_site ADD FOREIGN KEY (web_close_date_sk) REFERENCES date_dim (d_date_sk);
ALTER TABLE store_returns ADD FOREIGN KEY (sr_item_sk, sr_ticket_number) REFERENCES store_sales (ss_item_sk, ss_ticket_number);
ALTER TABLE catalog_returns ADD FOREIGN KEY (cr_item_sk, cr_order_number) REFERENCES catalog_sales (cs_item_sk, cs_order_number);
ALTER TABLE web_returns ADD FOREIGN KEY (wr_item_sk, wr_order_number) REFERENCES web_sales (ws_item_sk, ws_order_number);

-- Indexes on the fact tables' date keys: most of the 99 queries restrict a fact table to a year or a
-- month through date_dim, and the primary keys do not start with the date.
CREATE INDEX store_sales_sold_date_idx        ON store_sales (ss_sold_date_sk);
CREATE INDEX store_returns_returned_date_idx  ON store_returns (sr_returned_date_sk);
CREATE INDEX catalog_sales_sold_date_idx      ON catalog_sales (cs_sold_date_sk);
CREATE INDEX catalog_returns_returned_date_idx ON catalog_returns (cr_returned_date_sk);
CREATE INDEX web_sales_sold_date_idx          ON web_sales (ws_sold_date_sk);
CREATE INDEX web_returns_returned_date_idx    ON web_returns (wr_returned_date_sk);
