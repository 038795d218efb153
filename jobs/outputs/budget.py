"""A team's monthly budget against its month-to-date spend. Pure: no Django.

The spend is the team's `TeamRow.cost` for the calendar month (jobs.outputs.leaderboard.period_rows: each
job's dated price book over its hours inside the month x its GPU-equivalents, jobs.evaluation.totals, the
same definition as "$ this week" on the leaderboard and team pages); the budget is `Team.monthly_budget_usd`
($ per calendar month, UTC). Nothing is computed a second way here: only the share of the budget that the
spend uses, and what is left.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from jobs.evaluation.costs import Amount


@dataclass(frozen=True)
class BudgetUse:
    """The month's spend against the budget. `share` is spend ÷ budget (0-1, above 1 when over); with a
    spend that is only a lower bound (jobs without a price) the share and "over" are lower bounds too, and
    what is left is an upper bound ("at most")."""

    budget_usd: float
    spent: Amount
    share: float | None
    share_is_lower_bound: bool
    remaining_usd: float | None

    @property
    def over(self) -> bool:
        """True when the spend certainly exceeds the budget (a lower bound above it counts)."""
        return self.spent.usd is not None and self.spent.usd > self.budget_usd

    @property
    def over_by_usd(self) -> float | None:
        """How far the spend is above the budget (a lower bound when the spend is), None when not over."""
        return self.spent.usd - self.budget_usd if self.over and self.spent.usd is not None else None

    @property
    def share_text(self) -> str:
        """'42.0 %', 'at least 42.0 %', or 'unknown' (spend unknown, or a $0 budget)."""
        if self.share is None:
            return "unknown"
        text = f"{self.share * 100:.1f} %"
        return f"at least {text}" if self.share_is_lower_bound else text


def budget_use(spent: Amount, budget_usd: Decimal | float | None) -> BudgetUse | None:
    """The month-to-date `spent` against `budget_usd`; None when the team has no budget."""
    if budget_usd is None:
        return None
    budget = float(budget_usd)
    if spent.usd is None:
        return BudgetUse(budget, spent, None, False, None)
    share = spent.usd / budget if budget > 0 else None  # a $0 budget has no share, only "over" or not
    return BudgetUse(
        budget_usd=budget,
        spent=spent,
        share=share,
        share_is_lower_bound=spent.lower_bound,
        remaining_usd=budget - spent.usd,
    )


@dataclass(frozen=True)
class Projection:
    """Where the month ends if the jobs running now keep running at their cost/day until the month's end:
    spend to date + their $/day x the days left. A lower bound when the spend to date is one or a running
    job's cost/day is unknown (no price): the unknown part is not added."""

    usd: float
    lower_bound: bool
    burn_usd_per_day: float
    days_left: float
    share: float | None  # of the budget, None without one (or a $0 budget)

    @property
    def text(self) -> str:
        """'$12,345' or 'at least $12,345'."""
        amount = f"${self.usd:,.0f}"
        return f"at least {amount}" if self.lower_bound else amount


def month_end_projection(
    spent: Amount,
    running_costs_per_day: list[float | None],
    seconds_left: float,
    budget_usd: Decimal | float | None,
) -> Projection | None:
    """The month-end spend at today's rate: `spent` (month to date) plus the running jobs' cost/day over the
    `seconds_left` in the month. None when the spend to date is unknown."""
    if spent.usd is None:
        return None
    known = [c for c in running_costs_per_day if c is not None]
    burn = sum(known)
    days = max(0.0, seconds_left) / 86400.0
    usd = spent.usd + burn * days
    budget = float(budget_usd) if budget_usd is not None else None
    return Projection(
        usd=usd,
        lower_bound=spent.lower_bound or len(known) < len(running_costs_per_day),
        burn_usd_per_day=burn,
        days_left=days,
        share=usd / budget if budget else None,
    )
