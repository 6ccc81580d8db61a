import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.security.Permission;

import kafka.admin.TopicCommand;
import kafka.utils.ZkUtils;
import kafka.utils.ZkUtils$;
import org.apache.kafka.common.security.JaasUtils;

/**
 * Kafka 0.9's kafka.admin.TopicCommand in one long-lived JVM, for the test suite (tests/support/topic_server.py).
 *
 * <p>A JVM per topic operation costs 1.5-2.5 s and about 1.5 s of CPU; here it is paid once per test process.
 * Requests: one command per line on stdin, TopicCommand's arguments separated by tabs. Replies on stdout, one per
 * request: a header line "status stdout-bytes stderr-bytes", then the command's stdout and stderr (UTF-8).
 * The command runs as TopicCommand.main would (same parsing, same ZooKeeper session settings, same "Error while
 * executing topic command" line and status 1), without main's System.exit. The JVM exits when stdin closes, so a
 * test process that dies leaves no JVM behind.
 */
public final class TopicServer {

    /** Where System.out/System.err (and log4j's console, and Scala's Console) write: the current command's buffer. */
    private static final class Capture extends OutputStream {
        volatile ByteArrayOutputStream target;

        @Override
        public void write(int b) {
            ByteArrayOutputStream t = target;
            if (t != null) {
                t.write(b);
            }
        }

        @Override
        public void write(byte[] b, int off, int len) {
            ByteArrayOutputStream t = target;
            if (t != null) {
                t.write(b, off, len);
            }
        }
    }

    /** A System.exit inside TopicCommand (usage errors, askToProceed) ends that command, not the server. */
    private static final class ExitRequested extends SecurityException {
        private static final long serialVersionUID = 1L;
        final int status;

        ExitRequested(int status) {
            super("System.exit(" + status + ")");
            this.status = status;
        }
    }

    private static volatile boolean exiting;

    public static void main(String[] ignored) throws Exception {
        // The real stdin/stdout are the request/reply channel; everything else is captured per command. Both are
        // replaced before any Kafka or Scala class is loaded, since log4j and scala.Console keep the stream they
        // find at their initialisation.
        BufferedReader requests = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        OutputStream replies = new FileOutputStream(FileDescriptor.out);
        Capture out = new Capture();
        Capture err = new Capture();
        System.setOut(new PrintStream(out, true, "UTF-8"));
        System.setErr(new PrintStream(err, true, "UTF-8"));
        System.setIn(new ByteArrayInputStream(new byte[0]));  // askToProceed reads a "y" from stdin: not ours
        guardExit();
        Class.forName("kafka.admin.TopicCommand$");  // load it now, so the first command is as quick as the rest
        replies.write("READY\n".getBytes(StandardCharsets.UTF_8));
        replies.flush();
        String line;
        while ((line = requests.readLine()) != null) {
            String[] args = line.isEmpty() ? new String[0] : line.split("\t", -1);
            ByteArrayOutputStream o = new ByteArrayOutputStream();
            ByteArrayOutputStream e = new ByteArrayOutputStream();
            out.target = o;
            err.target = e;
            int status;
            try {
                status = run(args);
            } catch (ExitRequested x) {
                status = x.status;
            } catch (Throwable t) {  // what main would let escape: the JVM's uncaught handler prints it, status 1
                t.printStackTrace();
                status = 1;
            } finally {
                System.out.flush();
                System.err.flush();
                out.target = null;
                err.target = null;
            }
            byte[] ob = o.toByteArray();
            byte[] eb = e.toByteArray();
            replies.write((status + " " + ob.length + " " + eb.length + "\n").getBytes(StandardCharsets.UTF_8));
            replies.write(ob);
            replies.write(eb);
            replies.flush();
        }
        exiting = true;
        System.exit(0);  // ZooKeeper client threads must not keep the JVM alive once its test process is gone
    }

    /** TopicCommand.main's body, returning its exit status instead of calling System.exit. */
    private static int run(String[] args) {
        TopicCommand.TopicCommandOptions opts = new TopicCommand.TopicCommandOptions(args);
        if (args.length == 0) {
            kafka.utils.CommandLineUtils.printUsageAndDie(opts.parser(), "Create, delete, describe, or change a topic.");
        }
        int actions = 0;
        for (joptsimple.OptionSpec<?> o : new joptsimple.OptionSpec<?>[] {
                opts.createOpt(), opts.listOpt(), opts.alterOpt(), opts.describeOpt(), opts.deleteOpt()}) {
            actions += opts.options().has(o) ? 1 : 0;
        }
        if (actions != 1) {
            kafka.utils.CommandLineUtils.printUsageAndDie(opts.parser(),
                "Command must include exactly one action: --list, --describe, --create, --alter or --delete");
        }
        opts.checkArgs();
        ZkUtils zkUtils = ZkUtils$.MODULE$.apply(opts.options().valueOf(opts.zkConnectOpt()), 30000, 30000,
                                                 JaasUtils.isZkSecurityEnabled());
        try {
            if (opts.options().has(opts.createOpt())) {
                TopicCommand.createTopic(zkUtils, opts);
            } else if (opts.options().has(opts.alterOpt())) {
                TopicCommand.alterTopic(zkUtils, opts);
            } else if (opts.options().has(opts.listOpt())) {
                TopicCommand.listTopics(zkUtils, opts);
            } else if (opts.options().has(opts.describeOpt())) {
                TopicCommand.describeTopic(zkUtils, opts);
            } else if (opts.options().has(opts.deleteOpt())) {
                TopicCommand.deleteTopic(zkUtils, opts);
            }
            return 0;
        } catch (ExitRequested x) {
            throw x;
        } catch (Throwable t) {
            System.out.println("Error while executing topic command : " + t.getMessage());
            t.printStackTrace();
            return 1;
        } finally {
            zkUtils.close();
        }
    }

    /**
     * Turns TopicCommand's System.exit calls into ExitRequested. Java 17 allows this (with a warning on stderr);
     * where a later Java refuses it, such a call ends the JVM and the Python side runs that command in a JVM of
     * its own instead, which answers as TopicCommand always did.
     */
    @SuppressWarnings("removal")
    private static void guardExit() {
        try {
            System.setSecurityManager(new SecurityManager() {
                @Override
                public void checkPermission(Permission perm) {
                }

                @Override
                public void checkPermission(Permission perm, Object context) {
                }

                @Override
                public void checkExit(int status) {
                    if (!exiting) {
                        throw new ExitRequested(status);
                    }
                }
            });
        } catch (UnsupportedOperationException refused) {
            // see above
        }
    }
}
