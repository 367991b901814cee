//! A plan's lookups when a mirror fails over: which other mirrors and
//! origin a lookup may be answered by, and the plan once the engine says
//! where each was served (then pinned, and its signatures read, there).

use super::*;

impl ObjectPlan {
    /// The other mirrors and the origin to try for lookup `target`, when its
    /// mirror fails over: how it fails over, and the image's origin (what
    /// the other mirrors' images are derived from).
    pub fn failover_of(
        &self,
        target: &Reference,
    ) -> Option<(&Arc<crate::policy::Failover>, &Reference)> {
        let ObjectPlan::Fields(f) = self else {
            return None;
        };
        f.plans
            .iter()
            .flatten()
            .find(|p| p.step == Step::Resolve && p.target == *target)
            .and_then(|p| Some((p.failover.as_ref()?, &p.origin)))
    }

    /// The plan with each lookup answered by another mirror (or the origin)
    /// than the one planned: `served` maps the planned target to where it
    /// was resolved, and whether that was a fallback to the origin.
    /// Signatures are then read, and the image pinned, where it was served.
    pub fn served_by(
        mut self,
        served: &AnswerMap<Reference, (Reference, Option<Arc<crate::policy::FellBack>>)>,
    ) -> ObjectPlan {
        if served.is_empty() {
            return self;
        }
        if let ObjectPlan::Fields(f) = &mut self {
            for p in f.plans.iter_mut().flatten() {
                if p.step != Step::Resolve {
                    continue;
                }
                if let Some((by, fell)) = served.get(&p.target) {
                    // The plan is shared with every admission of the image:
                    // this one alone was served elsewhere.
                    let p = Arc::make_mut(p);
                    p.target = by.clone();
                    p.fallback = fell.clone();
                }
            }
        }
        self
    }
}
