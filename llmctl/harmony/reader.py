"""An assistant's harmony output, read as it grows into its messages (channel, recipient, text) by
openai-harmony's StreamableParser.

The reader takes the generated text with harmony's markers kept (skip_special_tokens false), encodes only what
is new since the last call, and feeds those ids to the parser, so a stream costs one pass over its tokens.
Text the parser cannot read as harmony (a model that strays from the format) is kept, from there on, as one
final-channel message, so nothing the model wrote is lost."""

from __future__ import annotations

from dataclasses import dataclass

from llmctl.harmony.vocabulary import harmony_encoding

MAX_HEADER_CHARS = 200  # a role, a channel, a recipient and a content type take far fewer


@dataclass(frozen=True)
class HarmonyMessage:
    channel: str | None  # analysis, commentary, final (None: the model named none)
    recipient: str | None  # functions.NAME for a call
    text: str
    complete: bool  # ended by <|end|>, <|call|>, <|return|> or the end of the output


class HarmonyReader:
    def __init__(self) -> None:
        from openai_harmony import Role, StreamableParser

        self.encoding = harmony_encoding()
        self.parser = StreamableParser(self.encoding, role=Role.ASSISTANT)
        self.fed = 0  # characters of the text fed to the parser
        self.settled = 0  # characters up to the last point the parser was not inside a header
        self.strayed_at: int | None = None  # where the text stopped being harmony
        self.ended = False

    def read(self, text: str, final: bool) -> list[HarmonyMessage]:
        """The messages of text, which extends the text of the previous call."""
        upto = len(text) if final else _whole_markers_end(text, self.fed)
        if self.strayed_at is None and upto > self.fed:
            self._feed(text, upto)
        if final and not self.ended and self.strayed_at is None:
            self.ended = True
            self._end(text)
        return self._messages(text, final)

    def _feed(self, text: str, upto: int) -> None:
        from openai_harmony import HarmonyError, StreamState

        try:
            for token in self.encoding.encode(text[self.fed:upto], allowed_special="all"):
                self.parser.process(token)
        except HarmonyError:
            self.strayed_at = self.settled
            return
        self.fed = upto
        if self.parser.state != StreamState.HEADER:
            self.settled = upto
        elif upto - self.settled > MAX_HEADER_CHARS:
            self.strayed_at = self.settled  # no header is this long: the model is not writing harmony

    def _end(self, text: str) -> None:
        from openai_harmony import HarmonyError, StreamState

        if self.parser.state == StreamState.HEADER:
            if "<|" not in text[self.settled:] and text[self.settled:].strip():
                self.strayed_at = self.settled  # text that never became a message: not harmony
            return  # else a header cut off (max_tokens): markup, no message
        try:
            self.parser.process_eos()  # the stop token (<|call|>, <|return|>) is not in the text
        except HarmonyError:
            self.strayed_at = self.settled

    def _messages(self, text: str, final: bool) -> list[HarmonyMessage]:
        messages = [HarmonyMessage(message.channel, message.recipient,
                                   "".join(getattr(part, "text", "") for part in message.content), True)
                    for message in self.parser.messages]
        current = self.parser.current_content
        if self.parser.current_channel is not None or current:
            messages.append(HarmonyMessage(self.parser.current_channel, self.parser.current_recipient, current,
                                           final))
        if self.strayed_at is not None and len(text) > self.strayed_at:
            messages.append(HarmonyMessage("final", None, text[self.strayed_at:], final))
        return messages


def _whole_markers_end(text: str, start: int) -> int:
    """Where text may be fed up to: before a marker ("<|…|>") that has begun but not ended."""
    if text.endswith("<"):
        return len(text) - 1
    opened = text.rfind("<|", start)
    return opened if opened >= 0 and text.find("|>", opened) < 0 else len(text)
