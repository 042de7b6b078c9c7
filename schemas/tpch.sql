-- TPC-H schema (TPC-H Standard Specification, §1.4.1 table layouts, §1.4.2 constraints); the same eight
-- tables NAPLES benchmarked (NR §4.3.3.2, Fig. 54).
--
-- Types follow §1.3.1: "identifier" → INTEGER (BIGINT for the order key, whose sparse values pass
-- 2^31 from SF ≈ 360 on), "integer" → INTEGER, "decimal" → DECIMAL(15,2), "fixed text, size N" →
-- CHAR(N), "variable text, size N" → VARCHAR(N), "date" → DATE.
--
-- Primary keys are declared with each table; foreign keys and their indexes come last (ALTER TABLE,
-- CREATE INDEX) so that a bulk loader can COPY the data first and let PostgreSQL validate each foreign
-- key and build each index once, in one pass.

CREATE TABLE region (
    r_regionkey  INTEGER       NOT NULL,
    r_name       CHAR(25)      NOT NULL,
    r_comment    VARCHAR(152),
    PRIMARY KEY (r_regionkey)
);

CREATE TABLE nation (
    n_nationkey  INTEGER       NOT NULL,
    n_name       CHAR(25)      NOT NULL,
    n_regionkey  INTEGER       NOT NULL,
    n_comment    VARCHAR(152),
    PRIMARY KEY (n_nationkey)
);

CREATE TABLE part (
    p_partkey     INTEGER        NOT NULL,
    p_name        VARCHAR(55)    NOT NULL,
    p_mfgr        CHAR(25)       NOT NULL,
    p_brand       CHAR(10)       NOT NULL,
    p_type        VARCHAR(25)    NOT NULL,
    p_size        INTEGER        NOT NULL,
    p_container   CHAR(10)       NOT NULL,
    p_retailprice DECIMAL(15,2)  NOT NULL,
    p_comment     VARCHAR(23)    NOT NULL,
    PRIMARY KEY (p_partkey)
);

CREATE TABLE supplier (
    s_suppkey    INTEGER        NOT NULL,
    s_name       CHAR(25)       NOT NULL,
    s_address    VARCHAR(40)    NOT NULL,
    s_nationkey  INTEGER        NOT NULL,
    s_phone      CHAR(15)       NOT NULL,
    s_acctbal    DECIMAL(15,2)  NOT NULL,
    s_comment    VARCHAR(101)   NOT NULL,
    PRIMARY KEY (s_suppkey)
);

CREATE TABLE partsupp (
    ps_partkey    INTEGER        NOT NULL,
    ps_suppkey    INTEGER        NOT NULL,
    ps_availqty   INTEGER        NOT NULL,
    ps_supplycost DECIMAL(15,2)  NOT NULL,
    ps_comment    VARCHAR(199)   NOT NULL,
    PRIMARY KEY (ps_partkey, ps_suppkey)
);

CREATE TABLE customer (
    c_custkey    INTEGER        NOT NULL,
    c_name       VARCHAR(25)    NOT NULL,
    c_address    VARCHAR(40)    NOT NULL,
    c_nationkey  INTEGER        NOT NULL,
    c_phone      CHAR(15)       NOT NULL,
    c_acctbal    DECIMAL(15,2)  NOT NULL,
    c_mktsegment CHAR(10)       NOT NULL,
    c_comment    VARCHAR(117)   NOT NULL,
    PRIMARY KEY (c_custkey)
);

CREATE TABLE orders (
    o_orderkey      BIGINT         NOT NULL,
    o_custkey       INTEGER        NOT NULL,
    o_orderstatus   CHAR(1)        NOT NULL,
    o_totalprice    DECIMAL(15,2)  NOT NULL,
    o_orderdate     DATE           NOT NULL,
    o_orderpriority CHAR(15)       NOT NULL,
    o_clerk         CHAR(15)       NOT NULL,
    o_shippriority  INTEGER        NOT NULL,
    o_comment       VARCHAR(79)    NOT NULL,
    PRIMARY KEY (o_orderkey)
);

CREATE TABLE lineitem (
    l_orderkey      BIGINT         NOT NULL,
    l_partkey       INTEGER        NOT NULL,
    l_suppkey       INTEGER        NOT NULL,
    l_linenumber    INTEGER        NOT NULL,
    l_quantity      DECIMAL(15,2)  NOT NULL,
    l_extendedprice DECIMAL(15,2)  NOT NULL,
    l_discount      DECIMAL(15,2)  NOT NULL,
    l_tax           DECIMAL(15,2)  NOT NULL,
    l_returnflag    CHAR(1)        NOT NULL,
    l_linestatus    CHAR(1)        NOT NULL,
    l_shipdate      DATE           NOT NULL,
    l_commitdate    DATE           NOT NULL,
    l_receiptdate   DATE           NOT NULL,
    l_shipinstruct  CHAR(25)       NOT NULL,
    l_shipmode      CHAR(10)       NOT NULL,
    l_comment       VARCHAR(44)    NOT NULL,
    PRIMARY KEY (l_orderkey, l_linenumber)
);

-- Foreign keys (§1.4.2.3).
ALTER TABLE nation   ADD CONSTRAINT nation_region_fk      FOREIGN KEY (n_regionkey) REFERENCES region (r_regionkey);
ALTER TABLE supplier ADD CONSTRAINT supplier_nation_fk    FOREIGN KEY (s_nationkey) REFERENCES nation (n_nationkey);
ALTER TABLE customer ADD CONSTRAINT customer_nation_fk    FOREIGN KEY (c_nationkey) REFERENCES nation (n_nationkey);
ALTER TABLE partsupp ADD CONSTRAINT partsupp_part_fk      FOREIGN KEY (ps_partkey) REFERENCES part (p_partkey);
ALTER TABLE partsupp ADD CONSTRAINT partsupp_supplier_fk  FOREIGN KEY (ps_suppkey) REFERENCES supplier (s_suppkey);
ALTER TABLE orders   ADD CONSTRAINT orders_customer_fk    FOREIGN KEY (o_custkey) REFERENCES customer (c_custkey);
ALTER TABLE lineitem ADD CONSTRAINT lineitem_orders_fk    FOREIGN KEY (l_orderkey) REFERENCES orders (o_orderkey);
ALTER TABLE lineitem ADD CONSTRAINT lineitem_part_fk      FOREIGN KEY (l_partkey) REFERENCES part (p_partkey);
ALTER TABLE lineitem ADD CONSTRAINT lineitem_supplier_fk  FOREIGN KEY (l_suppkey) REFERENCES supplier (s_suppkey);
ALTER TABLE lineitem ADD CONSTRAINT lineitem_partsupp_fk  FOREIGN KEY (l_partkey, l_suppkey)
    REFERENCES partsupp (ps_partkey, ps_suppkey);

-- Value ranges of the spec (§4.2.3; L_EXTENDEDPRICE = L_QUANTITY·P_RETAILPRICE, O_TOTALPRICE of 1 … 7 lines),
-- the ranges the shipped policies declare (tpch.toml). PostgreSQL enforces them on every row; sqldp reads
-- them from the database and leaves out the clamps that would change no value (sqldp.rewrite.unclamp). A
-- DDL file's constraints are claims: `--schema tpch.sql` does not use them.
ALTER TABLE part     ADD CONSTRAINT part_size_range       CHECK (p_size BETWEEN 1 AND 50);
ALTER TABLE part     ADD CONSTRAINT part_price_range      CHECK (p_retailprice BETWEEN 900.00 AND 2099.00);
ALTER TABLE partsupp ADD CONSTRAINT partsupp_qty_range    CHECK (ps_availqty BETWEEN 1 AND 9999);
ALTER TABLE partsupp ADD CONSTRAINT partsupp_cost_range   CHECK (ps_supplycost BETWEEN 1.00 AND 1000.00);
ALTER TABLE supplier ADD CONSTRAINT supplier_bal_range    CHECK (s_acctbal BETWEEN -999.99 AND 9999.99);
ALTER TABLE customer ADD CONSTRAINT customer_bal_range    CHECK (c_acctbal BETWEEN -999.99 AND 9999.99);
ALTER TABLE orders   ADD CONSTRAINT orders_price_range    CHECK (o_totalprice BETWEEN 810.00 AND 793422.00);
ALTER TABLE orders   ADD CONSTRAINT orders_prio_range     CHECK (o_shippriority = 0);
ALTER TABLE lineitem ADD CONSTRAINT lineitem_line_range   CHECK (l_linenumber BETWEEN 1 AND 7);
ALTER TABLE lineitem ADD CONSTRAINT lineitem_qty_range    CHECK (l_quantity BETWEEN 1 AND 50);
ALTER TABLE lineitem ADD CONSTRAINT lineitem_price_range  CHECK (l_extendedprice BETWEEN 900.00 AND 104950.00);
ALTER TABLE lineitem ADD CONSTRAINT lineitem_disc_range   CHECK (l_discount BETWEEN 0.00 AND 0.10);
ALTER TABLE lineitem ADD CONSTRAINT lineitem_tax_range    CHECK (l_tax BETWEEN 0.00 AND 0.08);

-- Indexes on foreign-key columns that no primary key starts with (the spec allows indexes on key
-- columns, §1.5.4). Without them the correlated subqueries of Q17 and Q20 rescan lineitem per row.
CREATE INDEX nation_regionkey_idx   ON nation (n_regionkey);
CREATE INDEX supplier_nationkey_idx ON supplier (s_nationkey);
CREATE INDEX customer_nationkey_idx ON customer (c_nationkey);
CREATE INDEX partsupp_suppkey_idx   ON partsupp (ps_suppkey);
CREATE INDEX orders_custkey_idx     ON orders (o_custkey);
CREATE INDEX lineitem_part_supp_idx ON lineitem (l_partkey, l_suppkey);
CREATE INDEX lineitem_suppkey_idx   ON lineitem (l_suppkey);
