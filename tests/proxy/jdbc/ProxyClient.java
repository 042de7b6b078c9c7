// What a JDBC client (pgjdbc) does through the sqldp proxy; run by tests/proxy/test_proxy_clients.py with
// `java -cp postgresql.jar ProxyClient.java PORT PASSWORD`. One line per step: "OK step detail" or "FAIL step message".
import java.sql.*;

public class ProxyClient {
    interface Step { String run() throws Exception; }

    static void step(String name, Step s) {
        try {
            System.out.println("OK " + name + " " + s.run());
        } catch (Exception e) {
            String state = e instanceof SQLException ? ((SQLException) e).getSQLState() : "";
            System.out.println("FAIL " + name + " " + state + " " + String.valueOf(e.getMessage()).split("\n")[0]);
        }
    }

    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://127.0.0.1:" + args[0] + "/analytics?sslmode=disable";
        try (Connection c = DriverManager.getConnection(url, "alice", args[1])) {
            step("readonly", () -> { c.setReadOnly(true); return "" + c.isReadOnly(); });
            step("isolation", () -> { c.setTransactionIsolation(Connection.TRANSACTION_SERIALIZABLE); return ""; });
            step("public", () -> {
                try (Statement s = c.createStatement();
                     ResultSet r = s.executeQuery("SELECT n_name, n_nationkey FROM nation ORDER BY 2")) {
                    StringBuilder b = new StringBuilder();
                    while (r.next()) b.append(r.getString(1)).append(':').append(r.getInt(2)).append(',');
                    return b.toString();
                }
            });
            step("prepared", () -> {  // past prepareThreshold (5): a named server-side statement, binary results
                try (PreparedStatement p = c.prepareStatement("SELECT n_name FROM nation WHERE n_nationkey = ?")) {
                    String last = "";
                    for (int i = 1; i <= 7; i++) {
                        p.setInt(1, 1 + i % 3);
                        try (ResultSet r = p.executeQuery()) { r.next(); last = r.getString(1); }
                    }
                    return last;
                }
            });
            step("private", () -> {
                try (Statement s = c.createStatement(); ResultSet r = s.executeQuery("SELECT COUNT(*) FROM visits")) {
                    r.next();
                    return r.getMetaData().getColumnTypeName(1) + " " + r.getDouble(1);
                }
            });
            step("fetchsize", () -> {  // autocommit off and a fetch size: a named portal, rows in batches of one
                c.setAutoCommit(false);
                try (Statement s = c.createStatement()) {
                    s.setFetchSize(1);
                    try (ResultSet r = s.executeQuery("SELECT faculty, COUNT(*) FROM visits GROUP BY faculty ORDER BY 1")) {
                        StringBuilder b = new StringBuilder();
                        while (r.next()) b.append(r.getString(1)).append(':').append(r.getMetaData().getColumnTypeName(2)).append(',');
                        return b.toString();
                    }
                } finally {
                    c.commit();
                    c.setAutoCommit(true);
                }
            });
            step("cursor", () -> {  // DECLARE, FETCH, MOVE, CLOSE as plain statements in a transaction
                c.setAutoCommit(false);
                try (Statement s = c.createStatement()) {
                    s.execute("DECLARE nations SCROLL CURSOR FOR SELECT n_name FROM nation ORDER BY n_nationkey");
                    StringBuilder b = new StringBuilder();
                    for (String f : new String[] {"FETCH 2 FROM nations", "FETCH PRIOR FROM nations", "FETCH LAST FROM nations"}) {
                        try (ResultSet r = s.executeQuery(f)) { while (r.next()) b.append(r.getString(1)).append(','); }
                    }
                    s.execute("CLOSE nations");
                    return b.toString();
                } finally {
                    c.commit();
                    c.setAutoCommit(true);
                }
            });
            step("tables", () -> {  // DatabaseMetaData: what a BI tool lists first
                try (ResultSet r = c.getMetaData().getTables(null, "public", "%", new String[] {"TABLE"})) {
                    StringBuilder b = new StringBuilder();
                    while (r.next()) b.append(r.getString("TABLE_NAME")).append(',');
                    return b.toString();
                }
            });
            step("columns", () -> {
                try (ResultSet r = c.getMetaData().getColumns(null, "public", "visits", "%")) {
                    StringBuilder b = new StringBuilder();
                    while (r.next()) {
                        b.append(r.getString("COLUMN_NAME")).append(':').append(r.getString("TYPE_NAME"));
                        b.append(':').append(r.getInt("NULLABLE")).append(',');
                    }
                    return b.toString();
                }
            });
            step("keys", () -> {
                try (ResultSet r = c.getMetaData().getPrimaryKeys(null, "public", "visits")) {
                    StringBuilder b = new StringBuilder();
                    while (r.next()) b.append(r.getString("COLUMN_NAME")).append(',');
                    return b.toString();
                }
            });
            step("timeout", () -> {  // the test makes the analysis take 5 s; the driver cancels after 1 s
                long t0 = System.nanoTime();
                try (Statement s = c.createStatement()) {
                    s.setQueryTimeout(1);
                    s.executeQuery("SELECT SUM(minutes) FROM visits");
                    return "answered";
                } catch (SQLException e) {
                    return e.getSQLState() + " " + (System.nanoTime() - t0) / 1_000_000;
                }
            });
        }
    }
}
