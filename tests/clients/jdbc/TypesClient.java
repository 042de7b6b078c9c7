// Parameterised statements through the sqldp proxy past pgjdbc's prepareThreshold (5): the first executions use
// the unnamed statement, later ones a named server-side statement with binary results. Run by
// tests/clients/test_clients_types.py as `java -cp postgresql.jar TypesClient.java PORT PASSWORD`. One line per
// execution: "OK step i type,type,... value,value,..." or "FAIL step i exception-class sqlstate message".
import java.sql.*;

public class TypesClient {
    static void run(Connection c, String step, String sql, int times, int[] args) {
        try (PreparedStatement p = c.prepareStatement(sql)) {
            for (int i = 1; i <= times; i++) {
                try {
                    p.setInt(1, args[(i - 1) % args.length]);
                    StringBuilder types = new StringBuilder(), values = new StringBuilder();
                    try (ResultSet r = p.executeQuery()) {
                        ResultSetMetaData m = r.getMetaData();
                        for (int k = 1; k <= m.getColumnCount(); k++) types.append(k > 1 ? "," : "").append(m.getColumnTypeName(k));
                        while (r.next()) {
                            for (int k = 1; k <= m.getColumnCount(); k++) {
                                Object o = r.getObject(k);
                                values.append(k > 1 ? "," : "").append(o == null ? "null" : o.getClass().getSimpleName() + ":" + (o instanceof Double ? "noisy" : o.toString().trim()));
                            }
                            values.append(';');
                        }
                    }
                    System.out.println("OK " + step + " " + i + " " + types + " " + values);
                } catch (Throwable e) {  // a RuntimeException from the driver is a failure too
                    String state = e instanceof SQLException ? ((SQLException) e).getSQLState() : "-";
                    System.out.println("FAIL " + step + " " + i + " " + e.getClass().getSimpleName() + " " + state + " "
                        + String.valueOf(e.getMessage()).split("\n")[0]);
                }
            }
        } catch (SQLException e) {
            System.out.println("FAIL " + step + " 0 prepare " + e.getSQLState() + " " + e.getMessage());
        }
    }

    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://127.0.0.1:" + args[0] + "/analytics?sslmode=disable";
        try (Connection c = DriverManager.getConnection(url, "alice", args[1])) {
            run(c, "int4", "SELECT n_regionkey FROM nation WHERE n_nationkey = ?", 8, new int[] {1, 2, 3});
            run(c, "mixed", "SELECT n_code, n_nationkey, n_name, n_regionkey FROM nation WHERE n_nationkey = ?", 8, new int[] {2, 3, 1});
            // a private answer with an integer group key: the key int4, the noisy values float8
            run(c, "private", "SELECT floor, COUNT(*), SUM(minutes) FROM visits WHERE id > ? GROUP BY floor", 7, new int[] {0});
        }
    }
}
