//! How long a call may wait, as a type: [`Forever`] (the blocking forms), [`Immediately`]
//! (`try_`), [`Until`] (`_timeout`, `_deadline`), [`Sooner`] (the earlier of two), and
//! [`Deadline`] (any of them at run time); and how closely a poll looks at the peer
//! ([`Look`]). One generic core per operation takes its patience; the forms a user calls pick
//! one.

use std::time::{Duration, Instant};

use std::convert::Infallible;

use crate::error::{Expiry, NotNow, TimedOut};

/// How closely a poll looks at the peer's liveness (a syscall, so never on the busy path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Look {
    /// Not at all: the busy path (a peer already known dead is still reported).
    Quick,
    /// Only if the last look is [`CHECK_INTERVAL`] old (one clock read otherwise): for `try_`
    /// calls, so a caller that only ever polls learns of a dead peer as fast as one that
    /// blocks, without a syscall on every poll.
    IfDue,
    /// Now: after a sleep.
    Now,
}

/// How long a call may wait, as a type: what running out of time yields is
/// [`Patience::Expired`], so the error a call can return is decided at compile time —
/// `Infallible` for a blocking call ([`Forever`]), [`NotNow`] for a `try_` call
/// ([`Immediately`]), [`TimedOut`] for a timed one ([`Until`]); [`Deadline`] chooses at run
/// time (a streamed record follows the call that started it).
pub(crate) trait Patience: Copy {
    /// What running out of time yields.
    type Expired;
    /// `Some` for a call that must not wait at all (what it yields): it looks once (and at the
    /// peer's liveness if that look is due), counts no idle time and never parks.
    fn immediate(self) -> Option<Self::Expired>;
    /// True for a call that may wait.
    #[inline]
    fn waits(self) -> bool {
        self.immediate().is_none()
    }
    /// True for a call that waits as long as it takes (a spanning record then goes part by
    /// part instead of whole or not at all).
    fn forever(self) -> bool;
    /// The time left (`None`: no limit), or what running out yields.
    fn remaining(self) -> Result<Option<Duration>, Self::Expired>;
}

/// A blocking call: never gives up.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Forever;

impl Patience for Forever {
    type Expired = Infallible;
    #[inline]
    fn immediate(self) -> Option<Infallible> {
        None
    }
    #[inline]
    fn forever(self) -> bool {
        true
    }
    #[inline]
    fn remaining(self) -> Result<Option<Duration>, Infallible> {
        Ok(None)
    }
}

/// A `try_` call: does not wait.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Immediately;

impl Patience for Immediately {
    type Expired = NotNow;
    #[inline]
    fn immediate(self) -> Option<NotNow> {
        Some(NotNow)
    }
    #[inline]
    fn forever(self) -> bool {
        false
    }
    #[inline]
    fn remaining(self) -> Result<Option<Duration>, NotNow> {
        Err(NotNow)
    }
}

/// A timed call: gives up at an instant (`None`: one too far to represent, so never).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Until(Option<Instant>);

impl Until {
    pub(crate) fn after(d: Duration) -> Until {
        Until(crate::sync::now().checked_add(d))
    }

    pub(crate) fn at(t: Instant) -> Until {
        Until(Some(t))
    }
}

impl Patience for Until {
    type Expired = TimedOut;
    #[inline]
    fn immediate(self) -> Option<TimedOut> {
        None
    }
    #[inline]
    fn forever(self) -> bool {
        self.0.is_none()
    }
    fn remaining(self) -> Result<Option<Duration>, TimedOut> {
        match self.0 {
            None => Ok(None),
            Some(t) => t
                .checked_duration_since(crate::sync::now())
                .filter(|d| !d.is_zero())
                .map(Some)
                .ok_or(TimedOut),
        }
    }
}

/// `inner`, or until `at` if that comes sooner: running out at `at` is `None`, `inner`'s own
/// running out is `Some`. For a wait that must also wake at an instant of its own (a gate's
/// alignment timeout).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sooner<P> {
    pub(crate) inner: P,
    pub(crate) at: Instant,
}

impl<P: Patience> Patience for Sooner<P> {
    type Expired = Option<P::Expired>;
    #[inline]
    fn immediate(self) -> Option<Option<P::Expired>> {
        self.inner.immediate().map(Some)
    }
    #[inline]
    fn forever(self) -> bool {
        false
    }
    fn remaining(self) -> Result<Option<Duration>, Option<P::Expired>> {
        let inner = self.inner.remaining().map_err(Some)?;
        let left = self
            .at
            .checked_duration_since(crate::sync::now())
            .filter(|d| !d.is_zero())
            .ok_or(None)?;
        Ok(Some(inner.map_or(left, |d| d.min(left))))
    }
}

/// Patience chosen at run time: each of the three.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Deadline {
    /// As [`Forever`].
    Never,
    /// As [`Immediately`].
    Now,
    /// As [`Until`].
    At(Until),
}

impl From<Forever> for Deadline {
    fn from(_: Forever) -> Deadline {
        Deadline::Never
    }
}

impl From<Immediately> for Deadline {
    fn from(_: Immediately) -> Deadline {
        Deadline::Now
    }
}

impl From<Until> for Deadline {
    fn from(u: Until) -> Deadline {
        Deadline::At(u)
    }
}

impl Patience for Deadline {
    type Expired = Expiry;
    #[inline]
    fn immediate(self) -> Option<Expiry> {
        matches!(self, Deadline::Now).then_some(Expiry::NotNow)
    }
    #[inline]
    fn forever(self) -> bool {
        match self {
            Deadline::Never => true,
            Deadline::Now => false,
            Deadline::At(u) => u.forever(),
        }
    }
    fn remaining(self) -> Result<Option<Duration>, Expiry> {
        match self {
            Deadline::Never => Ok(None),
            Deadline::Now => Err(Expiry::NotNow),
            Deadline::At(u) => u.remaining().map_err(Expiry::from),
        }
    }
}
