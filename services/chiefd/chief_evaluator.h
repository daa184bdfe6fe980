/* chiefd --evaluator: TF_CONFIG's evaluator task (docs/operations.md, "The evaluator"). It evaluates
 * each new checkpoint of the job on the test split, with chiefd's own evaluation (chief_eval.h), and
 * writes its scalars under <summary_dir>/eval; it serves nothing and records nothing in chief.db. */
#pragma once

/* The evaluator's main(): parses the command line as chiefd's (with --evaluator and TF_CONFIG's
 * evaluator task), then evaluates until the job has ended. Returns the exit status: 0 (the job DONE or
 * STOPPED and its checkpoints evaluated, or a signal), 65 (the job FAILED), 75 (the chief did not
 * answer within supervisor.ready_timeout_secs), 78 (bad configuration, a checkpoint of another model),
 * 1 otherwise. */
int chief_evaluator_main(int argc, char **argv);
