"""Per-token logprobs of one choice, in the completions shape (vLLM's, with `logprobs` = k: the
sampled token and up to k alternatives) or the chat shape (`logprobs.content`, `top_logprobs`).

Read from the call's run record (`output_tokens`: every streamed token with its logprob and
alternatives); `take()` returns the tokens since the previous take, so a stream reports each token
once (the text offsets run on from one take to the next). With `echo` and `logprobs`, `take_prompt()`
comes first: the prompt's tokens as the call's scoring fill computed them (`prompt_tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence

from parrot.protocol.openai_api import (
    TOKEN_ID_PREFIX,
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogProbs,
    TopLogprobEntry,
)
from parrot.serve.runtime.call_run import CallRun
from parrot.serve.runtime.scoring import StreamedToken
from parrot.text import Tokenizer


class TokenReport:
    def __init__(self, record: CallRun, output: str, tokenizer: Tokenizer, as_token_ids: bool = False) -> None:
        self.record = record
        self.output = output
        self.tokenizer = tokenizer
        self.as_token_ids = as_token_ids
        self.num_taken = 0
        self.text_offset = 0

    def _token(self, token_id: int) -> tuple[str, str]:
        """(the token as reported, its text)."""
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return (f"{TOKEN_ID_PREFIX}{token_id}" if self.as_token_ids else text), text

    def _new_tokens(self, final: bool) -> list[StreamedToken]:
        """`final`: the output is complete; before that, an EOS the engine streamed (the one token
        outside the context's) waits, so that it arrives with the finish reason, as in vLLM."""
        streamed = self.record.output_tokens.get(self.output, [])
        generated = self.record.output_token_ids.get(self.output, [])
        stop = len(streamed) if final else min(len(streamed), len(generated))
        tokens = streamed[self.num_taken : stop]
        self.num_taken += len(tokens)
        return tokens

    def take_prompt(self) -> CompletionLogProbs:
        """The prompt's tokens (an `echo` with `logprobs`: the call's `prompt_logprobs`), the first
        without a logprob (nothing precedes it); its text offsets start at 0, the output's follow."""
        return self._report(self.record.prompt_tokens or [])

    def take(self, final: bool = False) -> CompletionLogProbs:
        return self._report(self._new_tokens(final))

    def _report(self, tokens: Sequence[StreamedToken]) -> CompletionLogProbs:
        report = CompletionLogProbs(text_offset=[], token_logprobs=[], tokens=[], top_logprobs=[])
        for token_id, logprob, top in tokens:
            token, text = self._token(token_id)
            report.text_offset.append(self.text_offset)
            report.token_logprobs.append(logprob)
            report.tokens.append(token)
            alternatives = {} if logprob is None else {token: logprob}
            for t in top or []:
                alternatives.setdefault(self._token(t.token_id)[0], t.logprob)
            report.top_logprobs.append(alternatives or None)
            self.text_offset += len(text)
        return report

    def take_chat(self, final: bool = False) -> ChatLogprobs:
        content = []
        for token_id, logprob, top in self._new_tokens(final):
            token, text = self._token(token_id)
            alternatives = []
            for t in top or []:
                alt_token, alt_text = self._token(t.token_id)
                alternatives.append(TopLogprobEntry(token=alt_token, logprob=t.logprob, bytes=list(alt_text.encode())))
            content.append(
                ChatTokenLogprob(
                    token=token,
                    logprob=0.0 if logprob is None else logprob,
                    bytes=list(text.encode()),
                    top_logprobs=alternatives,
                )
            )
        return ChatLogprobs(content=content)
