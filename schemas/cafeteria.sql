-- The cafeteria example (Pankova & Laud, "Interpreting ε of differential privacy in terms of advantage in
-- guessing or approximating sensitive attributes" ([LP] in the README; NR §3.3.10): the cafeteria keeps a table
-- t of students, their faculty and how long they ate, and an analyst may only see
--     SELECT AVG(time) FROM t WHERE faculty = 'math';
-- Data: cafeteria.csv (loaded by sqldp.datasets.load_cafeteria). Policy: cafeteria.toml.

CREATE TABLE t (
    name    VARCHAR(40)  NOT NULL,                                -- "student name"
    faculty VARCHAR(40)  NOT NULL,
    time    INTEGER      NOT NULL CHECK (time BETWEEN 0 AND 60),  -- eating time, minutes
    PRIMARY KEY (name)
);
