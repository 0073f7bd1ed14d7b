//! The rollback of a failed ADD, one mechanism for every plugin: each step that completed is
//! pushed with what undoes it; when a later step fails, the steps are undone last first, every
//! undo runs even when an earlier one failed, and every failure is reported — logged, and added to
//! the ADD's error, whose code and message stay the cause's (the runtime sees why ADD failed).

use std::fmt::Display;

use plexus_cni::{Error, ErrorList};

/// The completed steps of one ADD, to undo if it fails. `S` names a step and what undoing it
/// needs; its `Display` names it in the report.
#[derive(Debug)]
#[must_use = "an ADD that fails must unwind its steps, one that succeeds must commit them"]
pub struct Undo<S> {
    steps: Vec<S>,
}

impl<S> Default for Undo<S> {
    fn default() -> Self {
        Undo { steps: Vec::new() }
    }
}

impl<S: Display> Undo<S> {
    pub fn new() -> Self {
        Undo::default()
    }

    /// `step` completed: undo it if the ADD fails from here on.
    pub fn push(&mut self, step: S) {
        self.steps.push(step);
    }

    /// The ADD succeeded: nothing is undone.
    pub fn commit(self) {}

    /// Undo every step, last first, with `undo`; `err` comes back with each failed undo in its
    /// details.
    pub fn unwind(self, err: Error, mut undo: impl FnMut(S) -> Result<(), Error>) -> Error {
        let mut failures = Report::default();
        for step in self.steps.into_iter().rev() {
            let what = step.to_string();
            failures.note(&what, undo(step));
        }
        failures.into_error(err)
    }

    /// [`Undo::unwind`] with an async `undo` (netlink verbs).
    pub async fn unwind_async(self, err: Error, mut undo: impl AsyncFnMut(S) -> Result<(), Error>) -> Error {
        let mut failures = Report::default();
        for step in self.steps.into_iter().rev() {
            let what = step.to_string();
            failures.note(&what, undo(step).await);
        }
        failures.into_error(err)
    }
}

/// The undos that failed, each with its code (as DEL's failures are kept: [`ErrorList`]).
#[derive(Default)]
struct Report(ErrorList);

impl Report {
    fn note(&mut self, what: &str, outcome: Result<(), Error>) {
        if let Err(e) = outcome {
            tracing::error!("rollback: {what}: {e}");
            self.0.push(what, e);
        }
    }

    fn into_error(self, err: Error) -> Error {
        if self.0.is_empty() {
            return err;
        }
        let rollback = format!("rollback failed: {}", self.0.describe());
        let details = if err.details.is_empty() { rollback } else { format!("{}; {rollback}", err.details) };
        err.with_details(details)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;

    #[derive(Debug, PartialEq)]
    enum Step {
        A,
        B,
        C,
    }

    impl Display for Step {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "step {self:?}")
        }
    }

    #[test]
    fn steps_are_undone_last_first_and_every_failure_is_reported_with_the_causes_code() {
        let mut undo = Undo::new();
        undo.push(Step::A);
        undo.push(Step::B);
        undo.push(Step::C);
        let mut order = Vec::new();
        let cause = Error::new(plexus_cni::code::KERNEL, "add route").with_details("EEXIST");
        let err = undo.unwind(cause, |s| {
            let failed = s != Step::B;
            order.push(s);
            if failed { Err(Error::internal("gone wrong")) } else { Ok(()) }
        });
        assert_eq!(order, vec![Step::C, Step::B, Step::A], "every undo ran, last first");
        assert_eq!((err.code, err.msg.as_str()), (plexus_cni::code::KERNEL, "add route"));
        assert_eq!(err.details, "EEXIST; rollback failed: step C: code 999: gone wrong; step A: code 999: gone wrong");
    }

    #[test]
    fn a_clean_rollback_leaves_the_error_as_it_was() {
        let mut undo = Undo::new();
        undo.push(Step::A);
        let err = undo.unwind(Error::invalid_config("bad"), |_| Ok(()));
        assert_eq!((err.msg.as_str(), err.details.as_str()), ("bad", ""));
    }

    #[test]
    fn async_undos_run_in_the_same_order() {
        let mut undo = Undo::new();
        undo.push(Step::A);
        undo.push(Step::B);
        let mut order = Vec::new();
        let err = {
            let unwound = std::pin::pin!(undo.unwind_async(Error::internal("x"), async |s| {
                order.push(s);
                Ok(())
            }));
            // Nothing in it waits: one poll finishes it.
            match unwound.poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
                std::task::Poll::Ready(err) => err,
                std::task::Poll::Pending => panic!("the unwind waited on nothing and did not finish"),
            }
        };
        assert_eq!(order, vec![Step::B, Step::A]);
        assert_eq!(err.details, "");
    }
}
