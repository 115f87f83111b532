"""The words people use to judge a reply, per language, for `followup.py`.

Each list is regex fragments without unbounded gaps (a gap is at most a few words). Words are
matched as whole words (no letter or digit on either side), except the Japanese, Chinese and
other unspaced ones (`cjk`), which are matched anywhere. Languages: English, French, German,
Spanish, Italian, Portuguese, Dutch, Polish, Russian, Turkish, Japanese, Chinese, Hindi (in
Latin and Devanagari script), Arabic, and the commonest words of Swedish (with Danish and
Norwegian), Indonesian, Vietnamese and Korean.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


def _split(text: str) -> list[str]:
    return text.split()


@dataclass(frozen=True)
class Words:
    """One kind of cue: spaced words (whole words) and unspaced ones (anywhere)."""

    spaced: tuple[str, ...]
    cjk: tuple[str, ...] = ()

    def pattern(self, at: str = "") -> re.Pattern[str]:
        """A pattern for any of them, anywhere; `at="start"`: opening the text (after a few
        marks); `at="end"`: closing it."""
        spaced = "|".join(self.spaced)
        parts = [rf"(?<![\w'’])(?:{spaced})(?![\w'’])"] if spaced else []
        if self.cjk:
            parts.append("(?:" + "|".join(sorted(self.cjk, key=len, reverse=True)) + ")")
        body = "|".join(parts)
        if at == "start":
            body = rf"^[\W_]{{0,6}}(?:{body})"
        elif at == "end":
            body = rf"(?:{body})\W{{0,2}}$"
        return re.compile(body, re.IGNORECASE)


# "no" and its kin, that open a turn: a verdict on their own ("nope", "nein", "нет", "違う")
NO = Words(
    (
        r"no{1,6}|nope|nop|nah+|naw|na+h|wrong|incorrect|not quite|not really|not exactly|"
        r"no way|not even close|(?:uh|um|hm+|erm|eh|well),? no",
        # fr, de, es, it, pt, nl
        r"non|nan|faux|pas du tout|pas vraiment|nein|nö|falsch|nicht ganz|stimmt nicht|"
        r"falso|incorrecto|incorrecta|para nada|nada que ver|macché|sbagliato|errato|"
        r"não|nao|errado|errada|nada disso|nee|neen|fout|klopt niet|niet helemaal",
        # pl, ru, tr, hi (Latin), ar, hi
        r"nie|źle|nieprawda|нет|неа|не так|неправильно|неверно|не совсем|hayır|hayir|"
        r"yanlış|yanlis|nahi|nahin|nai|galat|لا|كلا|خطأ|غلط|नहीं|गलत",
        # sv/da/no, id, vi
        # ("nei" is Italian "in the": not here)
        r"nej|nä|fel|feil|forkert|tidak|bukan|nggak|enggak|gak|salah|không",
    ),
    (
        "아니요",
        "아뇨",
        "いいえ",
        "いや",
        "ちがう",
        "違う",
        "違います",
        "不对",
        "不對",
        "错了",
        "錯了",
        "不是",
    ),
)
# a verdict anywhere in the turn: the reply is wrong
WRONG = Words(
    (
        r"wrong|incorrect|inaccurate|not (?:right|correct|true|accurate|quite right)|"
        r"(?:that'?s|thats|that is|this is|it'?s|its) (?:false|off|backwards|bogus|not it|"
        r"nonsense|a misattribution|made up)|"
        r"(?:you|u) (?:got|have|had) (?:it|that|this|them|those) (?:wrong|backwards|mixed up)|"
        r"you (?:mixed|swapped|confused|misread|misunderstood|misunderst\w{0,4})|"
        r"you (?:converted|calculated|counted|rounded) (?:\w+ ){0,2}wrong|"
        r"misattribut\w{0,6}|can'?t be right|doesn'?t (?:look|sound|seem) right|"
        r"(?:sounds|looks|seems|is|way) (?:way |totally |completely )?off|"
        r"not what i (?:asked|wanted|meant|need|needed)|"
        r"not even close|makes no sense|doubt it|i don'?t think so|are you sure|"
        r"useless|that'?s not (?:what|how)|isn'?t (?:\w{1,20} ){0,3}at all|off by one|"
        r"read the (?:code|question|docs|message|error)|"
        r"way too (?:much|many|high|low|little|few|big|small|expensive|cheap)|"
        r"(?:completely|totally|entirely) different|i don'?t think (?:that'?s|it'?s|this is)|"
        r"not (?:how|what) it (?:works|usually means|means)|"
        r"(?:please|pls|plz) (?:fix|correct) (?:this|that|it)|(?:please|pls|plz) fix(?= *[.!]|$)|"
        # a negation a few words before a word for "right": "c'est pas de l'anglais correct"
        r"(?:not|pas|nicht|no|não|non|niet|nie|не)\s(?:[\w'’-]{1,20}\s){0,3}?(?:right|"
        r"correct[ea]?|accurate|true|juste|exact[ea]?|richtig|korrekt|correct[oa]|ciert[oa]|"
        r"corrett[oa]|giust[oa]|cert[oa]|juist|klopt|poprawn[aey]|prawdziw[aey]|верно|"
        r"правильно|правда)",
        # fr, de, es, it, pt, nl
        r"c'?est faux|faux|pas (?:juste|correct|exact|bon|ça)|erron[ée]e?|n'importe quoi|"
        r"(?:vous vous|tu te) trompe[sz]?|pas (?:du tout )?ce que (?:j'ai|je|vous|tu)|"
        r"(?:vous avez|tu as) (?:inversé|confondu|mélangé)|"
        r"n'est pas du tout|ce n'est pas (?:ça|ca|ce que)|"
        r"falsch|stimmt (?:so )?nicht|nicht (?:richtig|korrekt)|quatsch|vertauscht|verwechselt|"
        r"incorrect[oa]|está mal|esta mal|(?:te|se) equivoc\w{1,4}|equivocad[oa]|"
        r"no es (?:correcto|cierto|así|eso|lo que)|eso no es|"
        r"sbagliat[oa]|errat[oa]|non è (?:corretto|giusto|vero|così|quello)|ti sbagli|"
        r"errad[oa]|incorret[oa]|não (?:é|está) (?:isso|verdade|certo|correto|assim)|"
        r"t[áa] errad[oa]|(?:se )?enganou|klopt niet|klopt er niks van|onjuist|vergist|"
        r"niet (?:juist|correct|goed|waar|wat ik)",
        # pl, ru, tr, hi (Latin), ar, hi
        r"źle|zle|błąd|błędn\w{1,3}|nieprawda|to nie (?:tak|prawda)|pomylił\w{0,3}|"
        r"mylisz się|bez sensu|nie to|неправильно|неверно|неправда|ошибка|ошиба\w{2,4}|"
        r"это не так|перепута\w{1,3}|бред|yanlış|yanlis|hatalı|doğru değil|dogru degil|"
        r"galat|sahi nahi|sahi nahin|theek nahi|galti|غير صحيح|ليس صحيح|مش صحيح|خطأ|غلط|"
        r"गलत|सही नहीं",
        # sv/da/no, id, vi
        r"fel|felaktig\w{0,2}|stämmer inte|inte rätt|du har fel|feil|forkert|det passer ikke|"
        r"salah|keliru|tidak benar|tidak tepat|kurang tepat|bukan itu|ngawur|"
        # ("sai" alone is Italian "you know": only "sai rồi", "bị sai")
        r"sai rồi|bị sai|không đúng|không chính xác|nhầm rồi",
    ),
    (
        "틀렸",
        "안 맞",
        "맞지 않",
        "정확하지 않",
        "틀려",
        "틀린",
        "잘못",
        "아니에요",
        "아닙니다",
        "아닌데",
        "違う",
        "違います",
        "ちがう",
        "間違",
        "まちが",
        "誤り",
        "不对",
        "不對",
        "错了",
        "錯了",
        "错误",
        "不正确",
        "搞错",
        "答非所问",
        "反了",
    ),
)
# the reply did not work: a rejection with no value to give
FAILED = Words(
    (
        r"(?:didn'?t|did not|doesn'?t|does not|don'?t|do not|won'?t|will not|can'?t|cannot) "
        r"(?:\w+ ){0,2}(?:work|working|compile|run|help|fix|load|start|exist|change|do "
        r"anything|anything|match)|"
        r"(?:still|now it|it now|it still|now) (?:fails|failing|broken|crash\w{0,3}|errors?|"
        r"doesn'?t|does not|wrong|red|getting|get|gets|see|seeing|shows|the same|times out|"
        r"timing out|hangs|loops|not|sounds|says|returns)|"
        r"same (?:error|crash|traceback|problem|issue|result|output|bug|thing|message)|"
        r"nothing (?:changed|happened|happens|works)|no (?:luck|change|difference|dice)|"
        r"made it worse|broke|broken|not working|matches nothing|try again|nothing changes|"
        r"(?:did|tried|done) (?:that|this|it) already|already (?:did|tried|done) (?:that|this|it)|"
        r"(?:test|tests|build|it|ci) (?:still )?(?:fails|failed|is failing|are failing|broke)",
        # fr, de, es, it, pt, nl
        r"ne (?:marche|fonctionne) (?:toujours |plus |vraiment )?pas|(?:ça|ca) (?:marche|"
        r"fonctionne) (?:toujours |plus )?pas|toujours pas|(?:la )?même erreur|rien n'a changé|"
        r"funktioniert (?:immer noch |noch immer |leider )?nicht|geht (?:immer noch |noch )?nicht|"
        r"klappt (?:immer noch )?nicht|(?:der )?gleiche fehler|hat nicht geholfen|"
        r"no funciona|sigue sin funcionar|no sirve|sigue igual|(?:el )?mismo error|no compila|"
        r"non funziona|non va|(?:lo )?stesso errore|non compila|ancora niente|"
        r"não funciona|nao funciona|não funcionou|continua (?:igual|sem|dando)|(?:o )?mesmo erro|"
        r"não deu certo|werkt (?:nog steeds |nog altijd )?niet|dezelfde fout|lukt niet",
        # pl, ru, tr, hi (Latin), ar, hi
        r"nie działa|nie dziala|(?:dalej|nadal|wciąż) nie|ten sam błąd|nic nie dało|"
        r"не работает|не помогло|та же ошибка|не компилируется|ничего не изменилось|"
        r"çalışmıyor|calismiyor|çalışmadı|olmadı|işe yaramadı|aynı hata|"
        r"kaam nahi kar\w{0,4}|kaam nahin kar\w{0,4}|kaam nahi kiya|nahi chal\w{0,4}|nahi hua|"
        r"same error|"
        r"لا يعمل|لم يعمل|ما زال لا|لم ينجح|نفس الخطأ|نفس المشكلة|ما اشتغل(?:ت)?|مش شغال|"
        r"काम नहीं|"
        # the past, where the lists above give the present ("no funcionó")
        r"no funcionó|no sirvió|no ha funcionado|n'a pas (?:marché|fonctionné)|"
        r"hat nicht (?:funktioniert|geklappt)|non ha funzionato|heeft niet gewerkt|"
        r"nie zadziałało|не сработало|не заработало|düzelmedi|"
        # a negation a few words before "solved": "das Problem ist noch nicht gelöst"
        r"(?:not|nicht|non|niet|nie|не|no|não|pas)\s(?:[\w'’-]{1,20}\s){0,2}?(?:solved|fixed|"
        r"resolved|gelöst|behoben|risolto|opgelost|rozwiązan[ey]|решено|resuelto|resolvido|"
        r"résolu)|"
        # sv/da/no, id, vi
        r"funkar inte|fungerar inte|funkade inte|fungerade inte|hjälpte inte|samma fel|"
        r"virker ikke|fungerer ikke|hjalp ikke|"
        r"tidak berhasil|gak berhasil|nggak berhasil|masih tidak bisa|tetap tidak bisa|"
        r"masih gak bisa|masih nggak bisa|masih error|tetap error|masih gagal|masih sama|"
        r"tetap sama|gagal|vẫn không|vẫn lỗi|vẫn bị lỗi|không chạy|không hoạt động",
    ),
    (
        "안 돼",
        "안돼",
        "안 되",
        "안되",
        "안 됩니다",
        "작동하지 않",
        "여전히 오류",
        "같은 오류",
        "動かない",
        "動きません",
        "できない",
        "できません",
        "直らない",
        "直りません",
        "変わらない",
        "変わりません",
        "同じエラー",
        "うまくいかない",
        "不行",
        "没用",
        "沒用",
        "不管用",
        "还是报错",
        "還是報錯",
        "同样的错误",
        "没有用",
        "👎",
    ),
)
# the reply is right, or worked, or is thanked for
ACCEPT = Words(
    (
        r"thanks?|thank you|thx|ty|tysm|cheers|perfect|great|awesome|excellent|brilliant|"
        r"exactly|correct|spot on|good job|well done|bingo|lgtm|looks good|confirmed|legend|"
        r"good catch|nice catch|well spotted|"
        r"right answer|you'?re (?:right|correct|a lifesaver|the best)|"
        r"that'?s (?:right|correct|it|perfect|the one|exactly it)|makes sense|appreciate it|"
        r"that was it|that did it|(?:that|this|it) (?:works|worked|fixed it|did the trick)|"
        r"works now|worked|works like a charm|solved|lifesaver|nailed it|all green|"
        r"(?:tests?|it|build|ci|everything) (?:all )?(?:pass(?:es)?|passing|is green|are green|"
        r"works|compiles)(?: now)?|(?:passes|passing|green|compiles|builds) now|"
        r"no more errors|no errors anymore|👍|🙏",
        # fr, de, es, it, pt, nl
        r"merci|parfait|exactement|c'?est (?:ça|ca|correct|juste|bon)|nickel|(?:ça|ca) marche|"
        r"(?:ça|ca) fonctionne|super|génial|impeccable|tout à fait|bien vu|"
        r"danke|genau|perfekt|richtig|stimmt|hat geklappt|funktioniert|passt|"
        r"gracias|perfecto|exacto|correcto|sí|funciona|genial|así es|eso es|"
        r"obrigad[oa]|valeu|perfeito|exatamente|certo|correto|funcionou|isso mesmo|deu certo|"
        r"grazie|perfetto|esatto|giusto|corretto|funziona|ottimo|proprio così|"
        r"dank ?je(?: ?wel)?|dank u(?: ?wel)?|bedankt|klopt|precies|werkt",
        # pl, ru, tr, hi (Latin), ar, hi
        r"dzięki|dzieki|dziękuję|dziekuje|zgadza się|dokładnie|działa|świetnie|racja|"
        r"спасибо|верно|правильно|точно|работает|отлично|всё верно|именно|"
        r"teşekkür\w{0,8}|tesekkur\w{0,8}|sağ ?ol|sag ?ol|doğru|dogru|evet|aynen|çalıştı|harika|"
        r"shukriya|dhanyavaad|dhanyawad|sahi hai|sahi|bilkul|ho gaya|theek hai|badhiya|"
        r"شكرا|شكراً|صحيح|صح|تمام|نجح|اشتغل(?:ت)?|ممتاز|بالضبط|धन्यवाद|सही|हो गया",
        # the past, where the lists above give the present ("funcionó")
        r"funcionó|sirvió|se arregló|ça a (?:marché|fonctionné)|geklappt|gelöst|"
        r"ha funzionato|risolto|opgelost|zadziałało|сработало|заработало|помогло|düzeldi|"
        # sv/da/no, id, vi
        # ("tack" alone thanks only as the whole turn: "svara på svenska tack" asks, "please")
        r"tack så mycket|tusen tack|tackar|tack för|takk for|tak for|stämmer|det funkar|"
        r"det fungerar|funkade|fungerade|toppen|det virker|"
        r"terima kasih|makasih|makasi|berhasil|mantap|betul|sudah bisa|udah bisa|"
        r"cảm ơn|cám ơn|đúng rồi|chính xác|được rồi|tuyệt",
    ),
    (
        "감사",
        "고마워",
        "고맙",
        "맞아",
        "맞습니다",
        "정확",
        "해결됐",
        "해결되었",
        "잘 돼",
        "잘 됩니다",
        "완벽",
        "ありがとう",
        "その通り",
        "正解",
        "合って",
        "できました",
        "動きました",
        "直りました",
        "助かりました",
        "完璧",
        "谢谢",
        "謝謝",
        "对的",
        "對的",
        "没错",
        "沒錯",
        "正确",
        "可以了",
        "好了",
        "完美",
        "解决了",
    ),
)
# praise that approves only where it opens the turn ("Lovely, just what I had in mind"; "Paris
# is lovely in spring" approves nothing)
ACCEPT_OPENING = re.compile(r"^\W{0,3}(?:lovely|wonderful|fantastic|amazing)\b", re.IGNORECASE)
# "yes", "ok", "top": acceptance only as the whole turn ("ok, and what about 3 + 4?" is none,
# "the top predator" approves nothing)
WEAK_ACCEPT = re.compile(
    r"^\W{0,3}(?:(?:yes|yep|yup|yeah|ok|okay|k|sure|nice|cool|good|alright|right|fine|oui|"
    r"d'accord|ja|sí|si|sim|sì|tak|да|evet|haan|haan ji|vale|bueno|tack|takk|top|"
    r"はい|好|好的|嗯|نعم|हाँ)"
    r"[\s\W]{0,6}){1,3}$",
    re.IGNORECASE,
)
# what an acceptance word may not be followed by: "thanks in advance", "great question",
# "perfect weather", "correct me if", "thanks for nothing" (sarcasm), or an article ("c'est
# juste la plus grande ville": "just the", "exactly the same error")
NOT_ACCEPT_AFTER = re.compile(
    r"^-|^\s(?:in advance|for asking|for the next|question|weather|day|idea|news|me if|timing|"
    r"d'avance|im voraus|de antemano|in anticipo|desde já|alvast|"
    r"for nothing|pour rien|für nichts|por nada|per niente|"
    r"(?:the|an|la|le|les|un|une|des|du|el|los|las|il|lo|gli|os|het|een)\s)",
    re.IGNORECASE,
)
# what says "nothing wrong": "no complaints", "nothing wrong with that", "not bad"; the hedge
# "correct me if I'm wrong", which judges nothing; and "not right now", which declines
NEGATED = re.compile(
    r"(?<!\w)(?:no complaints|nothing wrong|not wrong|no issues|no problems?|not bad|"
    r"not right now|not just now|not for now|pas pour l'instant|jetzt nicht|ahora no|"
    r"nada de malo|rien à redire|nichts falsch|correct me if i'?m wrong|"
    r"corrige[zs]?-moi si je me trompe|corr[ií]geme si me equivoco|correggimi se sbaglio|"
    r"korrigier(?:e|t)? mich,? wenn ich (?:mich irre|falsch liege))(?!\w)",
    re.IGNORECASE,
)
# a word of thanks named as a value, not thanks given: "thank you です", "ありがとう（arigatou）
# です" (a copula after it; "その通りです" is "that's right")
NAMED_THANKS = re.compile(
    r"(?:thank you|thanks|ありがとう|merci|gracias|danke|grazie|obrigad[oa]|спасибо|谢谢|謝謝|"
    r"감사합니다)\s?(?:[(（][^()（）]{0,30}[)）])?\s?(?:です|だ(?!\w))",
    re.IGNORECASE,
)
# a negation right after an acceptance word takes it back ("sahi nahi", "not correct")
NEGATION_AFTER = re.compile(
    r"^\W{0,3}(?:not?|nahi|nahin|nicht|pas|non|não|niet|nie|не|değil|degil|inte|ikke|tidak|"
    r"bukan|không|じゃない|ではない)\b",
    re.IGNORECASE,
)
# "but": what follows it is the part that is wrong ("the first part is fine but ...")
BUT = Words(
    (
        r"but|though|however|except|mais|aber|jedoch|pero|sino|ma|però|mas|porém|maar|ale|"
        r"tylko|но|а|ama|fakat|lekin|لكن|بل|लेकिन",
    ),
    ("けど", "但是", "但", "不过", "不過"),
)
# "no" that is not a verdict: "no worries", "no more than 50 words", "nah, no need"; nor the
# negation of the user's own knowing or having ("no sé", "non lo sapevo", "nie wiem")
NOT_A_NO = re.compile(
    r"^\W{0,3}(?:no|non|não|nao|nie|не)\s(?:lo |le |la |o |a |to )?(?:sé|sabía|sabia|sabes|"
    r"tengo|tenía|tenho|tinha|puedo|posso|entiendo|entendi|capisco|sapevo|so|ho|avevo|sais|"
    r"savais|connais|wiem|wiedziałem|wiedziałam|mam|rozumiem|знаю|знал|знала|помню|понимаю|"
    r"могу|have|had|know|knew|idea|clue|remember)\b"
    r"|^\W{0,3}(?:no+|nah|nope|non|nein|nee|nie|нет)\W{0,3}(?:no )?(?:worries|problem|problems|"
    r"rush|need|thanks|thank you|idea|doubt|pressure|hurry|matter|kidding|offen[cs]e|big deal|"
    r"longer|more|less|fewer|further|other|one|complaints|issues|danke|merci|gracias|grazie|"
    r"hay problema|te preocupes|problema|problème|worry|stress|explanations?|prose|text|words|"
    r"working|details|fluff|intro|preamble|comments|formatting|markdown|emojis?|extra|"
    r"bullet points|bullets)\b",
    re.IGNORECASE,
)
# the user blames themselves, not the reply ("I typed the wrong movie", "my bad")
SELF = re.compile(
    r"(?<!\w)(?:i|i'?ve|i'?d|i'?m|me|my|mine)\s(?:\w+\s){0,3}?(?:was |were |am )?"
    r"(?:wrong|mistake|mistaken|typo|mixed|confused|misread)|"
    r"(?<!\w)(?:my bad|my mistake|my fault|sorry,? (?:my|i)|ignore me|ignore that|i meant)\b|"
    r"(?<!\w)(?:i|we) (?:thought|assumed|guessed|figured|believed|expected)\b|"
    r"(?<!\w)my (?:answer|guess|result|estimate|number) (?:was|is)\b",
    re.IGNORECASE,
)
# someone else's judgement, reported: "my friend says it's wrong", "my kid got it wrong"
OTHERS = re.compile(
    r"(?<!\w)(?:my|his|her|their|our|a)\s(?:\w+\s)?(?:friends?|kids?|son|daughter|wife|husband|"
    r"partner|girlfriend|boyfriend|teacher|professor|prof|boss|manager|colleague|coworkers?|"
    r"mom|mum|mother|dad|father|parents?|brother|sister|roommate|neighbou?r|classmates?|"
    r"students?|tutor|grandma|grandpa|uncle|aunt|cousin)\b"
    r"|(?<!\w)(?:he|she|they|someone|somebody|people|everyone|everybody)\s(?:says?|said|"
    r"thinks?|thought|claims?|insists?|told me)\b",
    re.IGNORECASE,
)
# the turn turns to something else: what it says is not about the reply
NEW_TOPIC = re.compile(
    r"(?<!\w)(?:unrelated|off[- ]topic|(?:different|another|other|random|side|new|separate) "
    r"question|on (?:another|a different|an unrelated) note|chang(?:e|ing) (?:of )?(?:the )?"
    r"subject|autre (?:question|chose)|otra (?:pregunta|cosa)|andere frage|altra domanda|"
    r"outra pergunta|andere vraag|inne pytanie|другой вопрос|başka bir soru)(?!\w)",
    re.IGNORECASE,
)
# an exclamation, not a verdict: "oh no", "oh no way"
EXCLAIM = re.compile(r"^\W{0,3}(?:oh|omg|aw+|ah)\W{0,3}no+\b", re.IGNORECASE)
# a question: its words open a sentence (or close it, in Turkish, Japanese and Chinese)
QUESTION_START = re.compile(
    r"(?:^|[.!?;:。！？]\s{0,3}|^\W{0,3}(?:and|so|ok|okay|hmm|also|but|wait),?\s)"
    r"(?:what|what's|whats|how|why|when|where|which|who|whose|whom|is it|is that|is this|"
    # a question asked with no mark: "is 3.13 out yet", "does it work on arm"
    r"(?:is|are|does|can)(?![\w'’])|"
    r"are there|is there|are you|do you|does|did you|can i|could i|should i|shall i|may i|"
    r"quoi|comment|pourquoi|quand|où|combien|quel|quelle|quels|est-ce|qu'est-ce|"
    r"wie|was|warum|wann|wo|wieviel|wie viel|welche|welcher|welches|"
    r"cosa|come|perché|quando|dove|quanto|quanta|quale|chi|"
    r"o que|por que|onde|quanto|qual|quem|"
    r"wat|hoe|waarom|wanneer|waar|hoeveel|welke|wie|"
    r"co|jak|dlaczego|kiedy|gdzie|ile|który|która|czy|"
    r"что|как|почему|когда|где|сколько|какой|какая|какие|кто|"
    r"kya|kaise|kyun|kyon|kab|kahan|kitna|kitne|kaun|"
    r"هل|ماذا|كم|كيف|أين|متى|لماذا|क्या|कैसे)(?!\w)",
    re.IGNORECASE,
)
QUESTION_END = re.compile(
    r"(?:\s(?:mi|mı|mu|mü|ne kadar|nedir|nerede|nasıl|kaç|ne zaman|hangisi|kim)|"
    r"(?:ですか|ますか|でしょうか|のか|かな|吗|嗎|呢|多少|什么|什麼|怎么|怎麼|哪里|哪個|哪个))"
    r"\W{0,4}$",
    re.IGNORECASE,
)
# a request for something new, not a verdict: "can you also ...", "now do 20 km"
REQUEST = re.compile(
    r"(?<!\w)(?:can|could|would|will) (?:you|u)(?! (?:check|look|read)\b)"
    r"|(?<!\w)(?:would be better|would suit me|(?:works|suits me) better)(?!\w)"  # a preference
    # "please write a function that ...": asked of the reply, not said of it
    r"|(?:^|[.!;:]\s{0,3})(?:please |pls |plz )?(?:(?:now|next|also|then|and now|please also|"
    r"pls also|ok now|"
    r"okay now)(?:,|:)?\s(?:do|try|give|make|write|tell|convert|show|list|add|what|how|translate|"
    r"explain|summari[sz]e|the same|for|same)|write|translate|explain|tell me|show me|make|add|"
    r"list|summari[sz]e|convert|do the same|what about|how about|"
    r"(?:actually )?(?:i|we) (?:need|want|'d like|would like|prefer|'ll need|will need)|"
    r"make it|change it to|switch (?:it )?to|"
    r"peux-tu|pouvez-vous|kannst du|können sie|könntest du|puedes|podrías|puoi|potresti|"
    r"podes|pode|poderia|kun je|kunt u|możesz|можешь|можете|можно)(?!\w)",
    re.IGNORECASE,
)
# "now", "next": a value after it is the next thing asked for ("now the 8 times table", "et
# maintenant pour 6 personnes"), not a correction of this one
NEXT = re.compile(
    r"^\W{0,3}(?:(?:and|ok|okay|so|et|und|y|e|en|a|а)\s)?(?:now|next|maintenant|ensuite|jetzt|"
    r"ahora|adesso|agora|nu|teraz|теперь|şimdi|ab|الآن|अब|次は|今度は|接下来|现在)(?!\w)",
    re.IGNORECASE,
)
# a request that restates what the user wants of this answer ("i need this as json"): it may
# state a rule, never a new question
WANT = re.compile(
    r"(?<!\w)(?:(?:i|we) (?:need|want|'d like|would like|prefer)|make it|change it to|"
    r"switch (?:it )?to|would be better|would suit me|(?:works|suits me) better)(?!\w)",
    re.IGNORECASE,
)
# a question that challenges the reply rather than asking something new ("are you sure?",
# "did you include row 1?"): it never makes the turn a question
CHALLENGE = re.compile(
    r"^\W{0,3}(?:are you (?:sure|including|counting|using|looking|reading|mixing|thinking)|"
    r"did you (?:include|count|forget|mean|use|read|check|mix|swap|round)|have you (?:checked|"
    r"tried|included|counted)|really|seriously|since when|how so|according to (?:whom|what)|"
    r"t'es sûr|vous êtes sûr|bist du sicher|sind sie sicher|estás seguro|está seguro|"
    r"sei sicuro|tem certeza|weet je het zeker|jesteś pewien|ты уверен|вы уверены|emin misin)",
    re.IGNORECASE,
)

# words a terse value may carry beside it ("42 mate", "1666, famously", "Толстой конечно")
FILLER = frozenset(
    _split(
        "hm hmm hmmm um uh erm eh well oh ah so lol lmao haha hahaha ha hah heh hehe jaja jajaja "
        "kkk kkkk kkkkk mdr xd xD ok okay mate buddy dude bro man pal boss bruh sir yaar bhai ji "
        "famously obviously clearly definitely certainly absolutely probably surely duh typo "
        "actually really though btw fyi pls please plz dai hoor hè hein quoi voyons bon enfin "
        "doch halt ja eben hombre tío tio pues cara né ne ué uai gente dus toch joh nu przecież "
        "chyba конечно же вообще ну da yani abi ya ki hai na re arre arey bas يا طبعا فقط بس "
        "تقريبا hello hi hey bonjour salut hallo hola ciao olá oi hoi cześć привет merhaba namaste "
        "مرحبا вообще-то lah dong sih deh kok nih kak smh ffs omg jeez ugh bruh "
    )
)
# words that put a value forward ("it's 17 km", "should be 8080", "i get 12.6", "c'est 12")
LEAD = Words(
    (
        r"it'?s|its|it is|that'?s|thats|that is|this is|they'?re|is|are|was|were|be|equals|"
        r"=|should be|must be|would be|more like|closer to|rather|i get|i got|got|get|gives|"
        r"gives me|giving|gave|returns|returned|return|prints|printed|outputs|output|"
        r"says|said|shows|showed|reads|called|named|spelled|spelt|means|made it|i count|"
        r"i make it|comes to|came to|you want|it'?s actually|i get|i'?m getting|i see|raises|"
        r"throws|fails with|errors with|takes|took|took us|takes us|costs|cost|cost us|weighs|"
        r"lasts|lasted|"
        r"i found|i have|i measured",
        # fr, de, es, it, pt, nl
        r"c'?est|c'était|ce sont|(?:ça|ca) fait|(?:ça|ca) donne|donne|plutôt|ist|sind|es ist|"
        r"es sind|eher|ergibt|gibt|son|da|sale|me sale|devuelve|más bien|è|sono|fa|dà|"
        r"restituisce|stampa|semmai|é|são|dá|está|tá|foi|era|fue|fu|war|waren|retorna|imprime|"
        r"het is|is het|zijn|geeft|eerder|es|"
        r"je trouve|j'?obtiens|j'?ai|(?:bei mir )?kommt|ich komme auf|ich bekomme|ich habe|"
        r"obtengo|me da|tengo|mi viene|ottengo|ho|eu tenho|me dá|obtenho|ik krijg|ik kom op|"
        r"ik heb|bij mij",
        # pl, ru, tr, hi (Latin), ar
        r"jest|są|wychodzi|mam|raczej|это|будет|выведет|выдаст|получается|получилось|скорее|"
        r"olur|eder|eşittir|yani|hai|hota hai|hoga|aata hai|aayega|هو|هي|يساوي|تساوي|"
        r"wychodzi mi|u mnie|у меня|получаю|bende|mujhe|أحصل على|عندي|zwraca|zwróci|wypisuje|"
        r"daje|возвращает|вернёт|выводит|döndürür|verir|yazdırır|yazar|liefert|gibt aus|"
        r"renvoie|retourne|affiche|devuelve|imprime|restituisce|stampa|geeft terug|print karega|"
        r"deta hai|يعيد|يطبع",
        # sv/da/no, id, vi
        r"det är|det var|är|var|blir|det er|er|adalah|yaitu|yang benar|harusnya|seharusnya|"
        r"là|phải là|đúng ra là",
    ),
    ("是", "等于", "應該是", "应该是", "才是", "输出", "輸出", "返回", "打印", "出力", "为", "為"),
)
# after these, the value runs to the end of the sentence ("it says ls: cannot access ...")
OUTPUT_LEAD = re.compile(
    r"(?:says|said|prints|printed|outputs|output|shows|returns|throws|raises|gives|"
    r"error is|message is)$",
    re.IGNORECASE,
)
# "not Y", in words that come before the wrong value (and after it, where a language puts
# its negation last): "12, not 10", "pas Hugo", "а не на Ленина", "20日ではない", "4 nahi"
NOT_BEFORE = re.compile(
    r"(?<!\w)(?:not|and not|but not|instead of|rather than|pas|et non|non pas|nicht|"
    r"statt|anstatt|no|y no|non|e non|não|e não|niet|en niet|nie|a nie|не|а не|ليس|وليس|"
    r"لا|بدل|nahi|inte|och inte|ikke|bukan|tidak|không phải)(?!\w)|不是|而不是|가 아니라|이 아니라",
    re.IGNORECASE,
)
NOT_AFTER = re.compile(
    r"\s{0,2}(?:değil|degil|nahi|nahin|nahi hai|ではない|じゃない|ではなく|じゃなくて|"
    r"ではありません|じゃありません)(?!\w)",
    re.IGNORECASE,
)
# "yes" and "no" that answer a yes/no question, per language (a reply that says "Yes, it is")
YES = re.compile(
    r"^\W{0,3}(?:yes|yeah|yep|oui|ja|sí|si|sim|tak|да|evet|haan|han|نعم|हाँ|हां|はい|是的|是)"
    r"(?!\w)",
    re.IGNORECASE,
)
NO_ANSWER = re.compile(
    r"^\W{0,3}(?:no|nope|non|nein|não|nee|nie|нет|hayır|nahi|nahin|لا|नहीं|いいえ|不是|不)"
    r"(?!\w)",
    re.IGNORECASE,
)
# months, for dates ("15 April 1912", "13 de agosto", "19 mai", "March 4, 2024")
MONTHS = (
    r"jan(?:uary|vier|uar|\.)?|feb(?:ruary|ruar|\.)?|février|mar(?:ch|s|\.)?|märz|apr(?:il|\.)?|"
    r"avril|may|mai|june?|juin|juni|july?|juillet|juli|aug(?:ust|\.)?|août|sep(?:t|tember|\.)?|"
    r"septembre|oct(?:ober|obre|\.)?|oktober|nov(?:ember|embre|\.)?|dec(?:ember|\.)?|"
    r"décembre|dezember|enero|febrero|marzo|abril|mayo|junio|julio|agosto|septiembre|"
    r"octubre|noviembre|diciembre|gennaio|febbraio|aprile|maggio|giugno|luglio|settembre|"
    r"ottobre|dicembre|janeiro|fevereiro|março|maio|junho|julho|setembro|outubro|novembro|"
    r"dezembro|januari|februari|maart|mei|augustus"
)
# a reply that only wishes the user well, praises them or closes the talk: thanks for it
# approve nothing
COURTESY = re.compile(
    r"\W{0,3}(?:good luck|best of luck|have (?:a )?(?:great|nice|good|lovely|fun)|enjoy|"
    r"(?:that'?s|what) (?:a |an )?(?:lovely|great|good|wonderful|nice|fun|sweet|thoughtful|"
    r"brilliant|beautiful) (?:idea|plan|choice|gift|name|question)|congratulations|congrats|"
    r"félicitations|felicidades|felicitaciones|herzlichen glückwunsch|parabéns|complimenti|"
    r"gefeliciteerd|gratulacje|поздравляю|tebrikler|"
    r"you'?re welcome|happy to help|glad (?:i could|to) help|take care|anytime|bon courage|"
    r"bonne (?:chance|journée|soirée)|viel (?:glück|erfolg)|buena suerte|boa sorte|"
    r"in bocca al lupo|succes|powodzenia|удачи|iyi şanslar|bol şans)\b[^.!?]{0,60}[.!?]{0,3}"
    r"(?:\s{1,3}[^.!?]{0,40}[.!?]{0,3})?",
    re.IGNORECASE,
)
# a reply that says what a program will print or do ("it prints", "you'll see", "returns"),
# not only what to run: an error the user then quotes contradicts it
OUTCOME = re.compile(
    r"(?<!\w)(?:says?|will say|prints?|printed|outputs?|returns?|returned|gives?|shows?|"
    r"displays?|raises?|throws?|fails? with|(?:you'?ll|you will) (?:see|get)|means|evaluates|"
    r"results? in|affiche|renvoie|retourne|donne|gibt|zeigt|liefert|devuelve|muestra|imprime|"
    r"restituisce|stampa|mostra|retorna|geeft|toont|zwraca|wypisuje|возвращает|выводит|"
    r"выдаст|döndürür|verir|print hoga|aata hai|يعيد|يطبع)(?!\w)|出力|返回|输出|表示され|出ます",
    re.IGNORECASE,
)
# a reply that asks the user for something they have: what follows answers it
ASK_USER = re.compile(
    r"(?:(?:^|[,;]\s)(?:please\s)?(?:let me know|tell me|send me|paste|share|show me|give me)"
    r"|\b(?:can|could) you (?:send|share|paste|tell|show|give) me)\b"
    r"(?!\s(?:if|whether|how it|how that|in case|when)\b)"  # "let me know if it works": feedback
    # the same asked in the other languages ("エラーメッセージを教えてください")
    r"|(?<!\w)(?:dites-moi|montrez-moi|envoyez-moi|dis-moi|montre-moi|sag mir|zeig mir|"
    r"schick mir|senden sie mir|dime|muéstrame|envíame|pásame|dimmi|mostrami|mandami|incolla|"
    r"me diga|me mostre|me mande|cole aqui|stuur me|laat me zien|plak|powiedz mi|pokaż mi|"
    r"wyślij mi|wklej|скажите|покажите|пришлите|вставьте|скинь|söyle|gönder|göster|"
    r"batao|bhejo|dikhao|أرسل لي|أخبرني|أرني)(?!\w)(?!,?\s(?:si|ob|se|of|czy|если|eğer|agar|إذا)\b)"
    r"|(?<!たら)(?<!か)(?:教えて|見せて|送って)|贴一下|發給我|发给我|(?<!是否)告诉我|告訴我",
    re.IGNORECASE,
)
# a reply that quizzes the user: what follows is an answer, not a verdict
QUIZ = re.compile(
    r"\b(?:true or false|quiz|riddle|guess|vrai ou faux|verdadero o falso|richtig oder falsch)\b",
    re.IGNORECASE,
)
# words that stand between a lead and its value ("it's about 8 hours", "c'est plutôt 12",
# "is dated 4 March"), prepositions and articles included ("it's in /etc", "nell'80")
BETWEEN = frozenset(
    _split(
        "about around roughly approximately approx actually really just only exactly probably "
        "like maybe more less nearly almost over under ~ dated now then still indeed so the a an "
        "in on at of to from by for into onto since until with environ plutôt à peu près le la "
        "les l' un une du de des en au aux dans à sur etwa ungefähr circa ca eher so der die das "
        "den dem ein eine in im am auf aus von bei unos unas cerca alrededor el los las un una en "
        "a de del al con circa tipo verso il lo gli i un una in nel nella nell' a al alla da di "
        "del cerca uns umas o os as um uma em no na de do da ao ongeveer zo'n rond de het een in "
        "op om van bij około jakieś mniej więcej w we na do z o od около примерно где-то почти на "
        "в во с из к от yaklaşık aşağı yukarı civarı lagbhag kareeb takriban qareeb حوالي تقريبا "
        "في على من إلى über ponad prawie blisko более свыше почти fast knapp ungefär omkring "
        "cirka sekitar kira-kira khoảng gần 약 como "
    )
)
# function words of the languages, and reactions: never a value on their own
STOP = frozenset(
    _split(
        "and or but not no so because since as please pls plz thanks thank you i me my the a an "
        "is was are were be been it its it's that this these those there here yet if to of for on "
        "in at by with from more less than like about just only your we our they them he she his "
        "her what which who how why when where do does did done have has had will would can could "
        "should may might must also too very really again still even now then ok okay yes yeah "
        "yep yup nope nah hmm hm huh oh ah wow ugh meh hey hi hello sure cool nice neat "
        "interesting wait well right wrong correct incorrect same one le la les un une des du de "
        "et ou mais pas ne est c'est ce il elle je tu vous nous der die das ein eine und oder "
        "aber nicht ist es ich du sie wir ja nein doch el los las y o pero es no sí si que yo tú "
        "lo una uno il lo gli e ma non è io tu che di o os as um uma e mas não é eu você que sim "
        "de het een en maar niet is ik jij je dat wel nee i a ale nie jest to ja ty tak co и а но "
        "не это я ты да нет что ve ama değil bir bu evet hayır hai hain nahi haan ka ki ke ko se "
        "mein main aur kiya kiye kar karo tha thi hua hui hota hoti gaya gayi raha rahi hoga है हैं "
        "था थी nothing everything anything something nobody everybody everyone someone anyone "
        "everywhere nowhere somewhere żaden żadnego żadnej żadna żadne nada rien nichts niente "
        "nulla nic ничего hiçbir udah sudah "
    )
)
# articles: capitalised inside a sentence, part of a name ("es La Paz", "in Den Haag")
ARTICLES = frozenset(_split("the la le les el los las il lo de het den der die das"))
# units a number keeps beside it even when the reply wrote none ("45 EUR", "3.5 kg")
UNITS = frozenset(
    _split(
        "km m cm mm nm µm mi ft kg g mg lb lbs oz l ml cl dl gal h hr hrs min mins s sec secs ms "
        "µs ns mph kph km/h kmh m/s psi bar pa kpa hpa kwh wh w kw mw v ma hz khz mhz ghz kb mb "
        "gb tb kib mib gib px pt em rem dpi fps rpm am pm a.m p.m uhr kcal cal bc bce ad ce v.chr "
        "n.chr a.c d.c percent cent degrees degree pts points eur usd gbp chf jpy inr cad aud "
        "sek nok dkk pln rub try rs kr zł zl tl euro euros dollar dollars pound pounds cent cents "
        "yen rupees rupee lakh crore million millions billion billions thousand mil millones "
        "milioni milhões miljoen miljard milionów миллиона миллионов тысяч milyon bin hour hours "
        "minute minutes second seconds day days week weeks month months year years meter meters "
        "metre metres kilometer kilometers kilometre kilometres mile miles feet foot inch inches "
        "gram grams gramm bpm tsp tbsp kilogram kilograms liter liters litre litres heure heures "
        "jours jour ans "
        "mètres kilomètres stunden stunde minuten tage jahre horas hora minutos días dias años "
        "anos metros kilómetros quilômetros quilómetros ore minuti giorni anni metri chilometri "
        "uur dagen jaar kilometer godzin godziny minut dni lat metrów kilometrów час часа часов "
        "минут минуты дней года лет метров километров км кг м см мм руб saat dakika gün yıl metre "
        "kilometre ghante ghanta din saal ساعة ساعات دقيقة يوم أيام سنة متر كم كغ "
        "lira lire liras real reais peso pesos złoty zloty forint koruna krona kronor kroner "
        "yuan rmb won baht dirham dirhams riyal rand naira shekel franc francs ruble rubles "
        "rouble roubles рублей рубля лир "
        "ora times fois mal veces vez volte vezes keer keren razy раз раза kez baar "
    )
)
# a rule restated in the next turn, in the languages above (`checks.find_rules` reads English
# requests); a count is the number written before the word ("max 3 frasi", "50 mots")
_N = (
    r"(\d{1,4}|one|two|three|four|five|ten|une?|deux|trois|ein(?:e|en)?|zwei|drei|una?|dos|tres|"
    r"due|duas|dois|één|twee|drie|jed(?:no|ną|en)|dwa|trzy|одно|одним|два|три|bir|iki|üç|ek|do|"
    r"teen)"
)
RULE_CUES: dict[str, re.Pattern[str]] = {
    "bullets": re.compile(
        r"\bbullets?\b|\bbullet ?points?\b|\bpuces?\b|\bviñetas?\b|\bstichpunkte?n?\b|"
        r"\baufzählung|\bpunti elenco\b|\belenco puntato\b|\btópicos\b|\bmarcadores\b|"
        r"\bopsomming\b|\bw punktach\b|\bpunktach\b|\bсписком\b|\bмаркированн|\bmaddeler|"
        r"箇条書き|要点列出|项目符号|列表形式|\bpoints mein\b|\bنقاط\b",
        re.IGNORECASE,
    ),
    "numbered": re.compile(
        r"\bnumbered\b|\bstep 1\b|\bnumérot|\bnummeriert|\bnumerad[oa]s?\b|\bnumerat[ae]\b|"
        r"\bgenummerd|\bponumerowan|\bнумерованн|\bnumaralı|番号付き|编号|\bnumbered steps\b",
        re.IGNORECASE,
    ),
    "json": re.compile(r"\bjson\b", re.IGNORECASE),
    "just_number": re.compile(
        r"\b(?:only|just) (?:the )?(?:number|figure|digits?)\b|\bnumbers? only\b|"
        r"\b(?:seulement|juste|uniquement) le (?:nombre|chiffre)\b|\bnur (?:die )?zahl\b|"
        r"\bsolo (?:el|il) n[úu]mero\b|\b(?:só|apenas|somente) o número\b|"
        r"\balleen (?:het )?(?:getal|nummer)\b|\btylko (?:liczb|wynik)|\bтолько (?:число|цифр)|"
        r"\bsadece (?:sayı|rakam)|数字だけ|只要数字|只给数字|\bsirf number\b|\bالرقم فقط\b",
        re.IGNORECASE,
    ),
    "max_sentences": re.compile(
        rf"\b{_N}\s(?:sentences?|phrases?|sätzen?|frases?|frasi|frase|zinnen|zin|zdani[ae]?|"
        rf"zdaniach|предложени[ея]м?|предложениях|cümle)\b|(\d{{1,2}})\s?(?:文|句)"
        r"|جملة\s(واحدة)|(\d{1,2})\sجمل",
        re.IGNORECASE,
    ),
    "max_words": re.compile(
        rf"\b{_N}\s(?:words?|mots|wörter|wörtern|palabras|parole|palavras|woorden|słów|слов|"
        rf"kelime|shabd|كلمة|كلمات)\b|(\d{{1,4}})\s?(?:語|字|词)",
        re.IGNORECASE,
    ),
}
# "as I said", "like I asked": the user restates what they asked for; with a rule it is that
# rule, without one it says the reply missed it
RESTATE = re.compile(
    r"\b(?:i (?:asked|wanted) for|as (?:i|we) (?:said|asked|requested)|like i (?:said|asked)|"
    r"i (?:said|told you)|that was the rule|as requested|comme (?:je l'ai dit|demandé)|"
    r"wie (?:gesagt|verlangt)|como (?:te )?(?:dije|pedí|pedi)|come (?:ho detto|richiesto)|"
    # "I wanted ...", not "what I wanted" (which approves)
    r"(?<!what )(?<!que )(?<!was )(?<!che )(?<!wat )(?<!co )(?<!что )"
    r"(?:i wanted|je voulais|ich wollte|quer[ií]a|volevo|eu queria|ik wilde|chciał(?:em|am)|"
    r"я хотел[аи]?))\b",
    re.IGNORECASE,
)
# the spellings of one unit, so "5,895 m" answers "4,895 meters" and "3h20" answers "5 h 30"
UNIT_FAMILIES = {
    "m": "m meter meters metre metres metros metri mètres metrów метров метра метр metre متر",
    "km": "km kilometer kilometers kilometre kilometres kilómetros quilômetros quilómetros "
    "kilomètres chilometri kilometrów километров км كم",
    "h": "h hr hrs hour hours heure heures horas hora ore ora uur stunde stunden godz godzin "
    "godziny час часа часов saat ghante ghanta ساعة ساعات",
    "min": "min mins minute minutes minuten minutos minuti minut minuty минут минуты dakika",
    "d": "day days jour jours tage dias días giorni dagen dni дней gün din",
    "y": "year years yr yrs ans jahre años anos anni jaar lat лет года yıl saal",
    "kg": "kg kilogram kilograms kilo kilos кг كغ",
    "g": "g gram grams gramm grammes gramos gramas grammi",
    "l": "l liter liters litre litres litros litri",
    "mi": "mi mile miles",
}
# what the units measure: "2 uur" answers "45 minuten", "40 km" does not
DIMENSIONS = {
    "length": "m km mi cm mm ft inch inches foot feet",
    "time": "h min d y s sec secs second seconds week weeks month months",
    "mass": "kg g mg lb lbs oz",
    "volume": "l ml cl dl gal",
    "clock": "am pm",
}
