"""Routing among many skills: kinds first, then BM25 over each skill's description and tasks."""

from __future__ import annotations

import pytest

from selftaught.errors import InputError
from selftaught.skill.routing import Route, SkillCard, SkillRouter, check_name, slug_name

pytest.importorskip("bm25s")


def _router() -> SkillRouter:
    return SkillRouter(
        [
            SkillCard(
                "sql-queries",
                "Write SQL queries against the orders database",
                tasks=("select the ten largest orders by total", "count customers per country"),
            ),
            SkillCard(
                "release-notes",
                "Draft release notes from a list of merged pull requests",
                tasks=("summarise these merged PRs into release notes",),
            ),
        ]
    )


def test_routes_to_the_skill_whose_tasks_fit() -> None:
    router = _router()
    assert router.route("count orders per customer in SQL").skill == "sql-queries"
    route = router.route("write release notes for the merged pull requests below")
    assert route.skill == "release-notes"
    assert route.runner_up in {None, "sql-queries"}
    assert route.score > route.runner_up_score


def test_one_near_task_routes_even_when_the_description_does_not_match() -> None:
    assert _router().route("count customers per country").skill == "sql-queries"


def test_no_shared_word_routes_to_no_skill() -> None:
    route = _router().route("zebra giraffe")
    assert route.skill is None and route.score == 0.0
    assert _router().route("").skill is None


def test_names_follow_the_agents_rule() -> None:
    assert slug_name("SQL Queries: the Orders DB!") == "sql-queries-the-orders-db"
    assert slug_name("!!!") == "skill"
    assert len(slug_name("x" * 200)) == 64
    for bad in ("SQL", "a--b", "-a", "a b", "x" * 65, ""):
        with pytest.raises(InputError):
            check_name(bad)


def test_cards_refuse_duplicates_and_empty_descriptions() -> None:
    with pytest.raises(InputError, match="share a name"):
        SkillRouter([SkillCard("a", "one"), SkillCard("a", "two")])
    with pytest.raises(InputError, match="description"):
        SkillCard("a", "  \n ")
    assert SkillCard("a", "two\nlines").description == "two lines"


def test_skill_md_round_trips_and_keeps_the_users_other_keys() -> None:
    from selftaught.skill.skill_md import SkillFile, parse_skill_md, render_skill_md

    card = SkillCard("sql-queries", 'Write SQL: "orders" db')
    text = render_skill_md(card, "\nUse CTEs.\n")
    assert text.startswith("---\nname: sql-queries\ndescription: ") and text.endswith("CTEs.\n")
    parsed = parse_skill_md(text, "x/SKILL.md")
    assert parsed == SkillFile(card=card, body="Use CTEs.")
    users = "---\nname: mine\ndescription: 'it''s mine'\nallowed-tools: Bash\n---\nbody\n"
    mine = parse_skill_md(users, "u")
    assert mine.card.description == "it's mine" and mine.extra == ("allowed-tools: Bash",)
    assert "allowed-tools: Bash" in mine.render()
    assert "allowed-tools" not in render_skill_md(mine.card, mine.body)
    for bad, why in (
        ("no front", "starts"),
        ("---\nname: a\n", "not closed"),
        ("---\nname: a\n---\n", "description"),
    ):
        with pytest.raises(InputError, match=why):
            parse_skill_md(bad, "bad.md")


def test_stop_words_alone_route_nowhere() -> None:
    router = SkillRouter([SkillCard("sql-queries", "Write the SQL for the orders database")])
    assert router.route("what is the weather like").skill is None
    assert router.route("the orders of the day").skill == "sql-queries"


def test_kinds_route_first_and_the_cards_of_skills_that_are_no_kind_the_rest() -> None:
    """A request of a kind goes to that kind's skill, or to none when the kind has no skill
    here (however well another card fits it); a skill that is a kind is never routed by its
    card; a request of no kind is routed by the cards of the skills that are no kind."""
    from selftaught.skill.routing import KindIndex

    kinds = KindIndex(
        {
            "sql-queries": {"orders": 0.6, "sql": 0.6, "customers": 0.52},
            "release-notes": {"release": 0.6, "notes": 0.6, "merged": 0.52},
        }
    )
    router = SkillRouter(
        [
            SkillCard("sql-queries", "Anything about the orders database and its invoices"),
            SkillCard("invoice-help", "Explain an invoice line: taxes, orders and release dates"),
        ],
        kinds,
    )
    sql = router.route("SQL for the orders of our customers")
    assert (sql.skill, sql.kind, sql.runner_up) == ("sql-queries", "sql-queries", None)
    assert sql.score >= kinds.similarity
    notes = router.route("release notes for what was merged")  # fits invoice-help's card too
    assert (notes.skill, notes.kind) == (None, "release-notes")
    invoice = router.route("explain this invoice: taxes and dates")  # of no kind: cards
    assert (invoice.skill, invoice.kind) == ("invoice-help", None)
    assert router.route("the orders database and its invoices").skill == "invoice-help"
    assert router.route("zebra giraffe") == router.route("") == Route(None, 0.0)
