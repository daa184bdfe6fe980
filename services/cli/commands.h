/* The psfleet commands, one file each (cli_<name>.c); psfleet.c dispatches to them. This header
 * declares nothing else and includes nothing, so that no command depends on another or on psfleet.c. */
#pragma once

/* Each gets argv from its own name on (argv[0] = "local") and returns the exit status. */
int cmd_local(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_watch(int argc, char **argv);
int cmd_top(int argc, char **argv);
int cmd_checkpoints(int argc, char **argv);
int cmd_placement(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_stop(int argc, char **argv);
int cmd_restart(int argc, char **argv);
int cmd_certs(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_gendata(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_run(int argc, char **argv);
