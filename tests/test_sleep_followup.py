"""The follow-up reader (`sleep/night/followup.py`) reads people, not one phrasing: value
before verdict, terse turns, partial corrections, names and code outputs, quoted values, the
languages `followup_words` lists, and turns that only look like feedback. The phrasings here
were written for these tests (none is copied from a corpus). Its patterns are bounded: 70 KB of
adversarial text is read in well under a second."""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from selftaught.sleep.night import followup_words as W
from selftaught.sleep.night.followup import has_cue, read_followup

# (the reply, the user's next turn, the value the turn gives as right)
CORRECTIONS = [
    # the value before the verdict, terse
    ("The answer is 24.", "42. not 24", "42"),
    ("It is 40 km.", "nope 42 km", "42 km"),
    ("The castle was built in 1798.", "1789!! you flipped the digits", "1789"),
    ("The lake is 38 m deep.", "83 m, typo i guess", "83 m"),
    ("Lisbon is the capital of Spain.", "madrid", "madrid"),
    ("Lisbon is the capital of Spain.", "Madrid obviously", "Madrid"),
    ("The loop runs 12 times.", "11 lol", "11"),
    ("It takes 20 minutes by bus.", "hmm, 35 minutes", "35 minutes"),
    # a verdict, then the value, said in many ways
    ("The invoice total is $1,240.", "that's off, it comes to $1,420", "$1,420"),
    ("Frankenstein was written by Bram Stoker.", "no, Mary Shelley wrote it", "Mary Shelley"),
    ("The meeting is at 3 pm.", "wrong, it was moved to 4 pm", "4 pm"),
    ("Boiling point of ethanol: 88 °C.", "it should be 78 °C", "78 °C"),
    ("The file has 200 lines.", "wc -l gives me 214", "214"),
    ("The sum is 97.", "I count 79, not 97", "79"),
    ("It is 12 km.", "are you sure? my map says 21 km", "21 km"),
    # partial corrections, reasons around the value
    ("Refund of 45 € issued on 2 March.", "the date is right but it was 54 €", "54 €"),
    ("Mars has 3 moons and a red surface.", "red yes, but it has 2 moons", "2 moons"),
    ("The tower is 300 m tall.", "324 m. the antenna counts", "324 m"),
    ("The flight takes 5 hours.", "it took us 7 hours, headwinds all the way", "7 hours"),
    ("The train leaves on 12 June.", "it leaves on 21 June, I have the ticket", "21 June"),
    # the unit kept: the reply's own written apart, an abbreviation, not the word after it
    ("Set the oven to 180°F.", "nope, 350 F", "350 F"),
    ("A tablespoon is 2 teaspoons.", "it's 3 tsp", "3 tsp"),
    ("Otobüs 2 saat sürer.", "hayır, 4 saat 15 dk sürüyor", "4 saat 15 dk"),
    ("A cup of rice weighs 100 g.", "more like 185g per cup", "185g"),
    # a number the reply's unit fits (a time for a time) over another number or a name
    ("De rit duurt 50 minuten.", "wrong, eerder 3 uur, het is 200 km", "3 uur"),
    ("The ferry takes 50 minutes.", "no, more like 3 hours, it's 90 km", "3 hours"),
    (
        "The flight from Dublin to Rome takes 5 hours.",
        "Ryanair Dublin. 2 hours 40 minutes, I flew it in May",
        "2 hours 40 minutes",
    ),
    # names, code outputs, quoted values
    ("The author of Dune is Isaac Asimov.", "it's Frank Herbert", "Frank Herbert"),
    ("`sorted([3, 1, 2])` returns [3, 2, 1].", "nope, it returns [1, 2, 3]", "[1, 2, 3]"),
    ("`1 / 0` in Python returns inf.", "it raises ZeroDivisionError", "ZeroDivisionError"),
    ("Use `git merge` here.", 'no, it\'s "git rebase" in our team', "git rebase"),
    ("The flag is -r.", "wrong flag, it's -R", "-R"),
    ("The variable is user_id.", "it's userId in this file", "userId"),
    ("`print(2 ** 3)` prints 6.", "it prints 8", "8"),
    # "X, not Y" where Y is the reply's
    ("The museum opens on Tuesday.", "it opens on Wednesday, not Tuesday", "Wednesday"),
    ("The room is 20 m².", "24 m², not 20", "24 m²"),
    ("The SUM formula returns #VALUE! here.", "it returns #DIV/0!, the range is empty", "#DIV/0!"),
    ("भारत की राजधानी मुंबई है।", "नहीं, दिल्ली है", "दिल्ली"),  # the copula after the name
    # a capitalised article inside a sentence is part of the name
    ("La capital de Bolivia es Lima.", "no, es La Paz", "La Paz"),
    ("De regering zit in Amsterdam.", "nee, Den Haag", "Den Haag"),
    # "X, not Y" where the reply said X of something else; a value put forward as a question
    ("The recipe for 4 uses 2 onions, so for 8 you need 3.", "for 8 you need 4, not 3", "4"),
    (
        "2 latas sirven para 4 personas, así que para 6 personas necesitas 2 latas.",
        "si son 2 latas para 4, para 6 son 3 latas no?? no 2",
        "3 latas",
    ),
    ("The bus leaves at 9:10.", "no no it leaves at 9:40", "9:40"),  # the verdict denies nothing
    ("The latest Python release is 3.12.", "there's no Python 3.14 yet, it's 3.13", "3.13"),
    # other languages
    ("Le total est de 10 €.", "non, c'est 12 €, pas 10", "12 €"),
    ("Der Zug fährt um 9:15.", "falsch, er fährt um 9:45", "9:45"),
    ("El vuelo dura 3 horas.", "qué va, son 5 horas", "5 horas"),
    ("Il museo chiude alle 18.", "sbagliato, chiude alle 19", "19"),
    ("A viagem leva 2 dias.", "não, são 4 dias", "4 dias"),
    ("De brug is 300 meter lang.", "nee hoor, het is 450 meter", "450 meter"),
    ("Paczka kosztuje 20 zł.", "nie, 25 zł", "25 zł"),
    ("Поездка занимает 3 часа.", "нет, это 5 часов", "5 часов"),
    ("Bilet 40 lira.", "hayır, 60 lira", "60 lira"),
    ("料金は1,000円です。", "違います、1,200円です", "1,200円"),
    ("全程大约30公里。", "不对，应该是35公里", "35公里"),
    ("Ticket 500 rupees ka hai.", "nahi yaar, 700 rupees hai", "700 rupees"),
    ("المسافة 30 كم.", "لا، المسافة 45 كم", "45 كم"),
    # a greeting opens the turn, the value follows
    ("El vuelo dura 21 horas.", "Hola, 12 horas, te equivocaste", "12 horas"),
    (
        "Le mont Ventoux culmine à 1 190 m.",
        "Bonjour, 1 910 m, vous avez inversé les chiffres",
        "1 910 m",
    ),
    ("Das Konzert ist am 3. Mai.", "am 13. Mai, nicht am 3.", "13. Mai"),
]

REJECTIONS = [
    ("Restart the router and it works.", "still broken after the restart"),
    ("The capital of Kenya is Mombasa.", "that's not right at all"),
    ("Here is the summary.", "this is not what I asked for"),
    ("Essayez de vider le cache.", "ça ne marche toujours pas"),
    ("Installiere das Update.", "funktioniert immer noch nicht"),
    ("Reinicia el equipo.", "sigue sin funcionar"),
    ("Het antwoord is 12.", "klopt niet"),
    ("Ответ: 12.", "это неправда"),
    ("Cevap 12.", "yanlış bu"),
    ("答えは12です。", "違うと思います"),
    ("The sum is 12.", "12?? really?"),
    ("Here are the scores: 4, 7, 9.", "I asked for the average, not a list"),
    # what the user wanted, a pronoun in capitals, a verb: no value
    ("Here are the 2023 sales figures.", "this isn't what I asked, I wanted the 2022 figures"),
    ("Clear the cache and reload the page.", "now NOTHING works, the page is blank"),
    ("Cache clear karo, sab theek ho jayega.", "kiya, par kaam nahi kiya"),
    # a value after a negation is denied, not put forward
    ("Open the file with Notepad on your Mac.", "Notepad doesn't exist on macOS"),
]

ACCEPTANCES = [
    ("Try clearing the cache.", "that did it, thanks!"),
    ("The capital of Peru is Lima.", "yep, that's right"),
    ("Vide le cache DNS.", "merci, ça marche"),
    ("Перезапусти сервис.", "спасибо, всё работает"),
    ("Reinicia el router.", "gracias, funciona"),
    ("It is 12 km.", "right, 12 km. thanks"),
    ("أعد تشغيل الراوتر.", "صح، اشتغل الآن"),
    ("Here is the summary in three bullets.", "that is exactly what I wanted"),  # no restated ask
    ("Voici le résumé.", "c'est exactement ce que je voulais"),
    ("Clear the DNS cache and restart the browser. Let me know if it works.", "works now, thanks"),
    ("The wedding is on the 12th.", "you're right, I had the date wrong"),
    ("Your order ships Monday.", "Monday works, thanks"),
]

RULES = [
    ("A long answer about sleep and screens.", "max 2 frases por favor", "max_sentences"),
    ("The total is 540 hours, from 45 by 12.", "solo el número", "just_number"),
    ("Les avantages sont nombreux.", "en liste à puces svp", "bullets"),
    ("持ち物はパスポートと充電器です。", "箇条書きでお願いします", "bullets"),
    ("Name: Ana, age 31.", "JSON formatında ver", "json"),
    ("A long paragraph about the project plan.", "in 30 Wörtern bitte", "max_words"),
    ("Nom : Dupont, ville : Nantes.", "i need this as json please", "json"),
    ("الطقس اليوم مشمس. درجة الحرارة 30. لا يوجد مطر.", "اكتبها في جملة واحدة", "max_sentences"),
]

# turns that only look like feedback
NOT_FEEDBACK = [
    ("The answer is 41.", "42 is my lucky number btw"),
    ("Do you want the metric version?", "no, 12 km is fine"),
    ("Which city are you flying from?", "Porto. not Lisbon, I moved"),
    (
        "Inception was directed by Christopher Nolan.",
        "I typed the wrong film, I meant Heat. who scored it?",
    ),
    ("Here is the essay.", 'translate "that is wrong" into German'),
    (
        "Here is a fruit salad: apple, pear, kiwi.",
        "correct me if I'm wrong but kiwis are berries right?",
    ),
    ("Quiz: true or false, bats are blind.", "false"),
    ("The distance is 12 km.", "what is the wrong way to measure it?"),
    ("The trip is 240 km.", "thanks in advance, can you also list hotels there?"),
    ("The capital of Chile is Santiago.", "ok, and what's the capital of Peru?"),
    ("Lyon is 465 km from Paris.", "et Bordeaux ?"),
    ("The Nile is 6,650 km long.", "那黄河呢？"),
    ("Your order total is €58.40.", "can I pay with paypal"),
    ("The first book came out in 1997.", "and the last one?"),
    ("The function throws a TypeError on None.", "what if I pass an empty string instead"),
    ("Here's the limerick about a cat.", "my cat is actually called Biscuit, can you use her name"),
    ("Here is a recipe for 4 people.", "actually I need it for 6 people, not 4"),
    ("It is 12 km.", "My answer was 14, but yours makes more sense"),
    ("It takes 3 hours.", "ugh 3 hours. my train is at 5 pm"),
    ("The capital of Australia is Canberra.", "Sydney is nicer though"),
    ("Python 3.12 came out in 2023.", "we are still on 3.8 at work"),
    ("Open the image in Paint on your laptop.", "Paint isn't a thing on Linux"),
    # thanks for a wish; a rule restated that these words cannot read
    ("Have a great trip to Oslo!", "thanks, I will!"),
    ("Good luck with the interview tomorrow!", "thank you!!"),
    ("The museum opens at 9.", "answer in Korean, as I said before"),
    # "none", "false": no value where the reply gave none of the kind
    ("W Pythonie `'ab' * 3` zwraca błąd TypeError.", "zwraca ababab, żadnego wyjątku"),
    ("There is no direct train from Lyon to Turin.", "false, I took it in March"),
    # a new topic, someone else's verdict, a hedge, an exclamation
    ("The museum opens at 9.", "thanks. unrelated question: how do I descale a kettle?"),
    ("The Great Wall is about 21,000 km long.", "my teacher says that's wrong. who do I believe?"),
    ("The Amazon is the largest river by volume.", "my son got this one wrong in class. the Nile?"),
    (
        "Here is a list of fish: cod, tuna, whale.",
        "correct me if I'm wrong but whales breathe air right? my niece asked",
    ),
    ("Reykjavik is the capital of Iceland.", "oh no way, we're going there in June! any tips?"),
    # answers to what the reply asked: after a few words, for what the user has, its options
    ("What is 3 squared? Take your time!", "9"),
    ("Let me know what the terminal printed.", "it printed: cannot open 'data.json'"),
    ("Do you want the short version or the long one?", "the short one, not the long one"),
]


@pytest.mark.parametrize(("reply", "turn", "value"), CORRECTIONS, ids=lambda x: str(x)[:30])
def test_a_correction_is_read_with_its_value(reply: str, turn: str, value: str):
    read = read_followup(turn, reply)
    assert read is not None and (read.kind, read.reference) == ("correction", value)
    assert read.thumb == "down"


@pytest.mark.parametrize(("reply", "turn"), REJECTIONS, ids=lambda x: str(x)[:30])
def test_a_rejection_without_a_value_is_a_thumbs_down(reply: str, turn: str):
    read = read_followup(turn, reply)
    assert read is not None and (read.kind, read.reference) == ("rejection", None)


@pytest.mark.parametrize(("reply", "turn"), ACCEPTANCES, ids=lambda x: str(x)[:30])
def test_an_acceptance_is_a_thumbs_up(reply: str, turn: str):
    read = read_followup(turn, reply)
    assert read is not None and read.kind == "acceptance"


@pytest.mark.parametrize(("reply", "turn", "kind"), RULES, ids=lambda x: str(x)[:30])
def test_a_rule_restated_in_another_language_is_read(reply: str, turn: str, kind: str):
    read = read_followup(turn, reply)
    assert read is not None and read.kind == "rule" and kind in {r.kind for r in read.rules}


@pytest.mark.parametrize(("reply", "turn"), NOT_FEEDBACK, ids=lambda x: str(x)[:30])
def test_a_turn_that_only_looks_like_feedback_is_no_signal(reply: str, turn: str):
    assert read_followup(turn, reply) is None


def test_a_turn_that_moves_on_holds_no_cue_for_a_model_to_stand_on():
    turn = "that's wrong but never mind. unrelated question: best time to visit Kyoto?"
    assert read_followup(turn, "The museum opens at 9.") is None
    assert not has_cue(turn, "The museum opens at 9.", "rejection")
    assert has_cue("that's wrong, it opens at 10", "The museum opens at 9.", "rejection")


def test_a_yes_or_no_fact_is_corrected_by_the_other_word():
    read = read_followup("no, it lost that status in 2006", "Is Pluto a planet? Yes, it is.")
    assert read is not None and (read.kind, read.reference) == ("correction", "no")


@pytest.mark.parametrize(
    ("reply", "turn"),
    [
        (
            "Here is a sonnet about rain: grey clouds gather low.",
            "that's not a sonnet, it has ten lines",
        ),
        (
            "The crash comes from a missing import on line 3.",
            "there's no missing import, look again",
        ),
    ],
)
def test_a_denial_with_a_copula_is_no_contrast_of_values(reply: str, turn: str):
    # "X's not Y" denies the reply; X is no value put in Y's place
    read = read_followup(turn, reply)
    assert read is not None and (read.kind, read.reference) == ("rejection", None)


@pytest.mark.parametrize(
    ("reply", "turn", "rule"),
    [
        (
            "Glaciers are slow rivers of ice that form where snow piles up faster than it melts, "
            "and they carve valleys as they move downhill over centuries.",
            "I said under 30 words",
            "max_words",
        ),
        ("Name: Rui, city: Braga.", "in JSON format, as I said before", "json"),
    ],
)
def test_a_restated_request_is_a_rule_not_a_value(reply: str, turn: str, rule: str):
    read = read_followup(turn, reply)
    assert read is not None and read.kind == "rule" and read.reference is None
    assert [r.kind for r in read.rules] == [rule]


@pytest.mark.parametrize(
    ("reply", "turn", "value"),
    [
        (
            "A pint in the UK is 473 ml.",
            "a UK pint is 568 ml, 473 ml is the American pint",
            "568 ml",
        ),
        ("Columbus reached the Americas in 1498.", "it's 1492 — 1498 is Vasco da Gama", "1492"),
        ("3 feet is about 0.5 m.", "3 feet is 0.91 m, you halved it", "0.91 m"),  # the sum again
        ("The Elbe is 865 km.", "the Elbe is 1094 km, 865 km is the Weser", "1094 km"),  # subject
    ],
)
def test_what_the_replys_value_really_is_is_not_the_correction(reply: str, turn: str, value: str):
    # "473 ml is the American pint" explains the mistake; the right value is said elsewhere
    read = read_followup(turn, reply)
    assert read is not None and (read.kind, read.reference) == ("correction", value)


@pytest.mark.parametrize(
    ("reply", "turn"),
    [
        ("HTTP status 418 means 'Unauthorized'.", "418 is the teapot joke. 401 is unauthorized"),
        (
            "Exit code 2 means 'command not found'.",
            "exit code 2 is misuse of a builtin, 127 is command not found",
        ),
    ],
)
def test_what_has_the_replys_value_is_not_the_correction(reply: str, turn: str):
    # "401 is unauthorized": 401 is what the reply's value names, not the right code for 418
    read = read_followup(turn, reply)
    assert read is None or read.kind != "correction"


def test_a_value_the_reply_already_gave_is_no_correction():
    read = read_followup("no, 12 km is wrong", "It is 12 km.")
    assert read is not None and (read.kind, read.reference) == ("rejection", None)
    assert read_followup("12 km, thanks", "It is 12 km.").kind == "acceptance"  # type: ignore[union-attr]


# ---- the fifth round: structure over phrasing ------------------------------------------------


def test_a_decimal_mark_makes_another_number():
    # "35" is not "3.5" said again: the contrast puts 35 in the reply's place
    read = read_followup("it's 35 not 3.5, you divided by 100", "The average of the scores is 3.5.")
    assert read is not None and (read.kind, read.reference) == ("correction", "35")


@pytest.mark.parametrize(
    ("reply", "turn"),
    [
        # "not Y" inside a question asks for something new
        (
            "Here is a function that keeps the even numbers.",
            "can you make it also skip values that are not numbers?",
        ),
        # a "wrong" word in a question qualifies what is asked
        ("Happy to help.", "wrong place to ask perhaps, but how do I fix a flat tyre?"),
        # "now ...": the next thing asked for, built on the reply
        ("The 5 times table: 5, 10, 15, 20, 25.", "now the 6 times table"),
        # the user fixes their own input
        (
            "The total of 4, 9 and 12 is 25.",
            "oops I typed the wrong number, the last should be 21 not 12. redo it?",
        ),
    ],
)
def test_a_turn_that_asks_builds_on_or_fixes_its_own_input_is_no_signal(reply: str, turn: str):
    assert read_followup(turn, reply) is None


@pytest.mark.parametrize(
    ("reply", "turn", "kind", "value"),
    [
        # after what to run, the error printed is a failure, not the right value
        ("Use =INDEX(A:A, 0) in D1.", "#VALUE! in every cell", "rejection", None),
        (
            "Run the migration with `alembic upgrade head`.",
            "Error: Can't locate revision 'abc123'",
            "rejection",
            None,
        ),
        # after what it would print, the error printed is the right value
        (
            "`open('x.txt')` raises a PermissionError when the file is missing.",
            "no, it raises FileNotFoundError",
            "correction",
            "FileNotFoundError",
        ),
    ],
)
def test_an_error_printed_corrects_only_a_reply_that_said_what_would_print(
    reply: str, turn: str, kind: str, value: str | None
):
    read = read_followup(turn, reply)
    assert read is not None and (read.kind, read.reference) == (kind, value)


@pytest.mark.parametrize(
    ("reply", "turn", "value"),
    [
        # a preposition before a name is no part of it; a capitalised article is ("La Paz")
        (
            "La novela es de Julio Cortázar.",
            "Es de Jorge Luis Borges, no de Cortázar",
            "Jorge Luis Borges",
        ),
        # an identifier ends where Chinese begins, and one that is longer is not the reply's
        ("二氧化碳的化学式是 CO。", "CO是一氧化碳，二氧化碳是CO2", "CO2"),
        # units written onto a number in Korean, a currency with letters, a rate
        ("세종대왕은 1390년에 태어났습니다.", "1397년이에요", "1397년"),
        ("A passagem custa R$ 12,00.", "não, custa R$ 15,50", "R$ 15,50"),
        ("Air density is about 2.5 kg/m³.", "1.2 kg/m³ at sea level", "1.2 kg/m³"),
        # an hour and its minutes in Italian, a count of times
        ("Il treno impiega 2 ore.", "no, è 1 ora e 40", "1 ora e 40"),
        ("Hij heeft de Tour 3 keer gewonnen.", "5 keer!", "5 keer"),
        # the reply's words after its unit carry on the unit only as a name ("PM Eastern")
        ("Give 250 mg cada 8 horas.", "no, 125 mg cada 8 horas", "125 mg"),
        ("The call is at 3 PM Eastern.", "2 PM Eastern, they moved it", "2 PM Eastern"),
        # a lead after a negation puts the value forward ("no" is "in the" in Portuguese)
        ("O frete custa R$ 20.", "tá errado, no site tá R$ 35", "R$ 35"),
    ],
)
def test_a_value_is_read_whole_and_no_more(reply: str, turn: str, value: str):
    read = read_followup(turn, reply)
    assert read is not None and (read.kind, read.reference) == ("correction", value)


def test_an_error_the_reply_asked_for_in_another_language_answers_it():
    reply = "エラーメッセージを教えてください。"
    assert read_followup("TypeError: 'NoneType' object is not iterable です", reply) is None


@pytest.mark.parametrize(
    ("reply", "turn", "kind"),
    [
        # a negation a few words before a word for "right"
        ("The capital of Canada is Toronto.", "that's not even remotely right", "rejection"),
        # a verdict written in words is no value, whatever its script
        ("أعد تشغيل البرنامج.", "لم ينجح", "rejection"),
        ("Vacía la papelera.", "nada, sigue igual", "rejection"),
        # the past where the lists give the present
        ("Borra la carpeta node_modules.", "ya funcionó", "acceptance"),
        ("Reinstala el driver.", "no funcionó", "rejection"),
        # Swedish, Indonesian, Vietnamese, Korean
        ("Starta om routern.", "det fungerar inte", "rejection"),
        ("Coba restart laptopnya.", "masih error juga", "rejection"),
        ("Hãy xóa bộ nhớ đệm.", "vẫn lỗi", "rejection"),
        ("브라우저 캐시를 지우세요.", "그래도 안 돼요", "rejection"),
        ("Starta om appen.", "tack så mycket, det funkar nu", "acceptance"),
        ("Ganti DNS ke 1.1.1.1.", "makasih, udah bisa", "acceptance"),
        ("Khởi động lại máy.", "cảm ơn, được rồi", "acceptance"),
        ("앱을 업데이트하세요.", "감사합니다, 이제 잘 돼요", "acceptance"),
    ],
)
def test_a_verdict_is_read_in_more_words_and_languages(reply: str, turn: str, kind: str):
    read = read_followup(turn, reply)
    assert read is not None and (read.kind, read.reference) == (kind, None)


@pytest.mark.parametrize(
    ("reply", "turn"),
    [
        # sarcasm in a fixed phrase; "tack" ending a request is "please"
        ("Use `rm -rf build` to clean it.", "that wiped my source folder. thanks for nothing"),
        ("The museum opens at 9.", "svara på svenska tack"),
        # a lone word after a reply that only said what to do reports what came of it
        ("Soak the beans for 2 hours.", "mushy."),
    ],
)
def test_thanks_that_thank_for_nothing_and_a_lone_word_after_an_instruction_are_no_signal(
    reply: str, turn: str
):
    assert read_followup(turn, reply) is None


@pytest.mark.parametrize(
    ("reply", "turn", "value"),
    [
        # "juste la capitale" is "only the capital", not "that's right"
        (
            "The largest city in Turkey is Ankara.",
            "c'est Istanbul la plus grande, Ankara c'est juste la capitale",
            "Istanbul",
        ),
        # a word a negation denies is not the reply's slot filled again
        ("Ibu kota Jawa Barat adalah Bogor.", "Bandung, Bogor bukan ibu kota provinsi", "Bandung"),
        # a filler after the value
        ("Столица Канады — Торонто.", "Оттава вообще-то", "Оттава"),
    ],
)
def test_a_value_beside_words_that_only_look_like_a_verdict_or_a_value(
    reply: str, turn: str, value: str
):
    read = read_followup(turn, reply)
    assert read is not None and (read.kind, read.reference) == ("correction", value)


@pytest.mark.parametrize(
    ("reply", "turn", "value"),
    [
        # a clause saying what the reply's value really is, with a plural copula
        ("Die Mehrwertsteuer in Österreich beträgt 19 %.", "20 %, die 19 sind Deutschland", "20 %"),
        # after a verdict, the number in the unit of the reply's claim, not the one beside the
        # reply's other words ("por persona" for "personas")
        (
            "Para 6 personas necesitas 300 g de pasta.",
            "300 g para 6?? qué va, se usan 600 g por lo menos, 100 por persona",
            "600 g",
        ),
        # a name the reply wrote before its number is part of the value
        (
            "Your train leaves from Platform 4.",
            "the app says Platform 9, it's an ICE",
            "Platform 9",
        ),
        ("Ubuntu 24.04 ships Python 3.9.", "mine shows Python 3.12.3", "Python 3.12.3"),
    ],
)
def test_the_value_in_the_place_of_the_replys_claim(reply: str, turn: str, value: str):
    read = read_followup(turn, reply)
    assert read is not None and (read.kind, read.reference) == ("correction", value)


def test_what_the_replys_claim_written_in_small_letters_is_is_not_the_correction():
    # "tim cook is Apple" says what the reply's claim is; "elon musk" is no value these read
    read = read_followup("tim cook is Apple. tesla is elon musk", "The CEO of Tesla is Tim Cook.")
    assert read is None or read.reference != "Apple"


@pytest.mark.parametrize(
    ("reply", "turn", "kind"),
    [
        # after the reply's question, a value beside "same thing" answers it
        ("Have you tried clearing the cache?", "yes. twice. same thing", "rejection"),
        # what has the reply's claim ("immutable") is no correction
        ("Yes, Python strings are mutable.", "they're immutable. lists are the mutable ones", None),
        # thanks for praise approve nothing; "top" thanks only as the whole turn
        ("What a lovely name for a puppy!", "thanks! should I get him a blue collar?", None),
        ("The fastest land animal is the Lion.", "lion is Africa's top predator", None),
    ],
)
def test_a_value_or_thanks_that_answer_or_explain_are_no_correction_or_acceptance(
    reply: str, turn: str, kind: str | None
):
    read = read_followup(turn, reply)
    assert (read.kind if read else None) == kind and (read is None or read.reference is None)


@pytest.mark.parametrize(
    ("reply", "turn", "kind", "value"),
    [
        # a verdict in words, its adverb or "please" aside, is no bare value
        ("Add `import os` at the top and rerun.", "still crashes, same error", "rejection", None),
        ("The Eiffel Tower is in Lyon.", "Not Lyon. Please fix.", "rejection", None),
        # a number stands in for the reply's number before a name or a word does
        (
            "Jupiter has 4 moons.",
            "Wrong, those are only the Medicean ones. It has 92 moons.",
            "correction",
            "92 moons",
        ),
        (
            "The area of a square with side 4 cm is 8 cm².",
            "That's half the perimeter, not the area. The area is 16 cm².",
            "correction",
            "16 cm²",
        ),
        # "Not Found" is the reply's own words, no denial of "Found"
        (
            "The status code for 'Not Found' is 403.",
            "Incorrect, 403 is Forbidden. Not Found is 404.",
            "correction",
            "404",
        ),
        # "am" after a number is the time of day
        (
            "At 4 pm in London it is 10 am in Chicago.",
            "it's 11 am in Chicago",
            "correction",
            "11 am",
        ),
        # praise that approves
        (
            "Here's the invitation rewritten in a warmer tone.",
            "Lovely, just what I had in mind.",
            "acceptance",
            None,
        ),
    ],
)
def test_a_verdict_or_value_read_past_words_that_only_look_like_one(
    reply: str, turn: str, kind: str, value: str | None
):
    read = read_followup(turn, reply)
    assert read is not None and (read.kind, read.reference) == (kind, value)


@pytest.mark.parametrize(
    ("reply", "turn"),
    [
        # "please write ..." asks for something new
        (
            "The primes start 2, 3, 5, 7, 11.",
            "Please write a function that returns the 10th prime.",
        ),
        # an answer that picks what the reply's question offered states no rule
        ("Do you want it as YAML or JSON?", "JSON"),
        ("How many bullet points should the summary have?", "4 bullets"),
        # "not right now" declines an offer
        ("Shall I also add tests?", "Not right now, thanks."),
    ],
)
def test_a_request_or_an_answer_to_the_replys_question_is_no_signal(reply: str, turn: str):
    assert read_followup(turn, reply) is None


def test_what_the_user_does_not_want_is_no_failure_of_the_reply():
    reply = "Multiplying 12 by 11 gives 132, since 12 × 10 is 120."
    read = read_followup("Only the figure please, I don't want the working shown.", reply)
    assert read is not None and read.kind == "rule"
    assert [r.kind for r in read.rules] == ["just_number"]


@pytest.mark.parametrize(
    ("reply", "turn"),
    [
        # a word of thanks named as the value ("it's merci"), not thanks given
        ("In French, 'thank you' is 'pardon'.", "merci です"),
        # a verdict quoted with an apostrophe inside it is mentioned, not said
        (
            "Here's the scene with the two brothers.",
            "My villain shouts 'You're wrong!' here — how do I make it sound scarier?",
        ),
    ],
)
def test_words_of_judgement_mentioned_are_no_judgement(reply: str, turn: str):
    assert read_followup(turn, reply) is None


@pytest.mark.parametrize(
    ("reply", "turn"),
    [
        # a question asked with no mark
        ("Python 3.12 added better error messages.", "is 3.13 out yet"),
        # what the user is doing, and the user's place, not the reply's value
        ("The printer supports A4 and Letter.", "I'm printing on A5 mostly"),
        ("It's 25°C in Lisbon today.", "nice, it's 12 here in Berlin"),
        ("Set the heating to 21°C.", "it's 3 outside right now, brr"),
        # praise that does not open the turn, an idiom
        ("Madrid is the capital of Spain.", "Madrid is lovely in spring"),
        (
            "Here's the email to your landlord.",
            "perfect timing, he just called. should I send it now?",
        ),
    ],
)
def test_a_value_or_praise_about_the_users_own_world_is_no_signal(reply: str, turn: str):
    assert read_followup(turn, reply) is None


@pytest.mark.parametrize(
    ("reply", "turn"),
    [
        # the negation of the user's own knowing or having opens the turn, no verdict
        ("El museo abre a las 10.", "no sé si llegaré a tiempo, ¿hay entradas online?"),
        ("Il museo apre alle 10.", "non lo sapevo! c'è un parcheggio vicino?"),
        ("Muzeum otwiera się o 10.", "nie wiem gdzie to jest, jak dojechać?"),
        # a preference asks for a change, it does not correct
        ("Your appointment is on May 5.", "May 12 would be better for me"),
    ],
)
def test_a_negated_verb_or_a_preference_is_no_signal(reply: str, turn: str):
    assert read_followup(turn, reply) is None


@pytest.mark.parametrize(
    ("reply", "turn", "value"),
    [
        # "2008 was the 3G" says what the reply's year really was (no conversion of units)
        ("The iPhone launched in 2008.", "2007 actually, 2008 was the 3G", "2007"),
        # a postposition and a copula after a name, in Latin script
        ("Taj Mahal Delhi mein hai.", "nahi, Agra mein hai", "Agra"),
        # "about", "over" and "it is" in more languages
        ("Wisła ma 800 km długości.", "ponad 1000 km, sprawdź", "1000 km"),
        ("Sveriges huvudstad är Göteborg.", "nej, det är Stockholm", "Stockholm"),
        ("Thủ đô của Úc là Sydney.", "sai rồi, là Canberra", "Canberra"),
        ("서울의 인구는 500만 명입니다.", "950만 명이에요", "950만 명"),
    ],
)
def test_a_value_read_in_more_shapes_and_languages(reply: str, turn: str, value: str):
    read = read_followup(turn, reply)
    assert read is not None and (read.kind, read.reference) == ("correction", value)


@pytest.mark.parametrize(
    ("reply", "turn", "value"),
    [
        # a filler of exasperation, the past of "it is", "like" before a number
        ("The capital of Australia is Sydney.", "canberra smh", "canberra"),
        ("Portugal aderiu à UE em 1990.", "foi em 1986", "1986"),
        ("La distancia es de unos 200 km.", "son como 350 km por autopista", "350 km"),
        ("Le match s'est terminé 0-0.", "c'était 3-1 pour Lyon", "3-1"),
    ],
)
def test_a_value_put_forward_by_more_words(reply: str, turn: str, value: str):
    read = read_followup(turn, reply)
    assert read is not None and (read.kind, read.reference) == ("correction", value)


def test_a_negation_before_solved_is_a_failure():
    read = read_followup("das Problem ist noch nicht gelöst", "Starte den Dienst neu.")
    assert read is not None and (read.kind, read.reference) == ("rejection", None)


@pytest.mark.parametrize(
    "turn",
    [
        # a verdict word of one language that is a plain word of another: Italian "sai" ("you
        # know", Vietnamese "wrong"), "nei" ("in the", Norwegian "no")
        "ah ok, sai che non lo sapevo",
        "nei giorni feriali o anche nel weekend?",
    ],
)
def test_a_word_of_one_language_is_no_verdict_in_another(turn: str):
    assert read_followup(turn, "Il museo apre alle 10.") is None


# ---- bounded time ---------------------------------------------------------------------------

SIZE = 70_000
BOUND_S = 1.0  # per input; measured here ~0.15 s at worst (two shared cores)
CAP_S = 10.0  # an input still running now is stopped: it failed already

# the literals the patterns are built from, and the shapes their values take
SEEDS = [
    *sorted(W.FILLER)[:40:4],
    *sorted(W.UNITS)[:60:6],
    *sorted(W.BETWEEN)[:40:5],
    *["no ", "nope ", "wrong ", "not ", "pas ", "nicht ", "нет ", "不对", "違う", "لا "],
    *["thanks ", "merci ", "it's ", "is ", "= ", "c'est ", "是"],
    *["1 ", "1,", "1.", "1-", "1:", "1/", "1×", "1'", "1年", "1 km ", "1 km and ", "1 h 1 "],
    *["A ", "Aa ", "aB ", "a_b ", "-a ", "/a", "[", "(", "`", "'a' ", '"a" ', "<", "«"],
    *["not 1 ", "it's 1 ", "Jan 1 ", "1 Jan ", "A is ", "it's the A ", "nell'1 ", "says a: "],
    *["Error: ", "?", "??", "!", ". ", ", ", " ", "bullets ", "1 words ", "a"],
]


class _TooSlow(Exception):
    pass


@contextlib.contextmanager
def _cap(seconds: float) -> Iterator[None]:
    """Raise _TooSlow in the main thread after `seconds` (where SIGALRM exists)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "setitimer"
    ):
        yield
        return

    def stop(*_: object) -> None:
        raise _TooSlow

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _seconds(turn: str, reply: str) -> float:
    start = time.perf_counter()
    try:
        with _cap(CAP_S):
            read_followup(turn, reply)
    except _TooSlow:
        return math.inf
    return time.perf_counter() - start


@pytest.mark.parametrize("seed", SEEDS, ids=repr)
def test_70_kb_of_adversarial_text_is_read_in_bounded_time(seed: str):
    big = (seed * (SIZE // len(seed) + 1))[:SIZE]
    for turn, reply in ((big, "It is 12 km."), ("no, it's 17 km", big), (big, big)):
        took = _seconds(turn, reply)
        assert took < BOUND_S, f"{seed!r} * {SIZE}: {took:.2f} s"
