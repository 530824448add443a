//! GPT-2's byte-level BPE tokenizer for `kiln generate`: the `r50k_base` encoding (GPT-2's 50,256
//! merges plus `<|endoftext|>`) through `tiktoken-rs`, which embeds it, so nothing is downloaded.
//!
//! Token ids are `u32` (GPT-2's vocabulary has 50,257 entries). Decoding follows Hugging Face's
//! `GPT2Tokenizer` (`errors="replace"`): bytes that are not valid UTF-8 (a model can emit a token
//! sequence that splits or garbles a multi-byte character) become U+FFFD, and an id outside the
//! vocabulary is an error. [`StreamDecoder`] decodes token by token for streaming output and emits
//! text only once its characters are complete; what it emits, concatenated, equals [`decode`] of
//! all the tokens.

use std::sync::LazyLock;

use tiktoken_rs::CoreBPE;

/// The end-of-text token, GPT-2's only special token.
pub const END_OF_TEXT: u32 = 50256;

/// The size of GPT-2's vocabulary (the ids `0..VOCAB_SIZE`).
pub const VOCAB_SIZE: usize = 50257;

/// The text of [`END_OF_TEXT`].
pub const END_OF_TEXT_STR: &str = "<|endoftext|>";

/// The encoding, parsed from the embedded ranks on first use (tens of milliseconds, once).
static BPE: LazyLock<CoreBPE> = LazyLock::new(|| {
    // The ranks are compiled into tiktoken-rs: a failure to parse them is a broken build, not input.
    tiktoken_rs::r50k_base().expect("tiktoken-rs's embedded r50k_base parses")
});

/// A token id that GPT-2's vocabulary does not have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownToken {
    /// The id.
    pub id: u32,
}

impl std::fmt::Display for UnknownToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "token id {} is not in GPT-2's vocabulary (ids 0..{VOCAB_SIZE})", self.id)
    }
}

impl std::error::Error for UnknownToken {}

/// The token ids of `text`. Special-token text (`<|endoftext|>`) is encoded as ordinary text; see
/// [`encode_with_special`] to have it become [`END_OF_TEXT`].
pub fn encode(text: &str) -> Vec<u32> {
    BPE.encode_ordinary(text)
}

/// The token ids of `text`, with each `<|endoftext|>` in it as the one token [`END_OF_TEXT`] (as
/// Hugging Face's GPT-2 tokenizer does).
pub fn encode_with_special(text: &str) -> Vec<u32> {
    BPE.encode_with_special_tokens(text)
}

/// The bytes `tokens` stand for, exactly (not necessarily UTF-8).
pub fn decode_bytes(tokens: &[u32]) -> Result<Vec<u8>, UnknownToken> {
    BPE.decode_bytes(tokens).map_err(|e| UnknownToken { id: e.token })
}

/// The text of `tokens`, invalid UTF-8 replaced by U+FFFD (as Hugging Face's GPT-2 tokenizer).
pub fn decode(tokens: &[u32]) -> Result<String, UnknownToken> {
    Ok(String::from_utf8_lossy(&decode_bytes(tokens)?).into_owned())
}

/// Decodes a stream of tokens into text as it comes: [`StreamDecoder::push`] returns the text
/// completed by one more token and holds back the bytes of a character not yet complete (at most
/// three); [`StreamDecoder::finish`] flushes them. Invalid bytes become U+FFFD as soon as they are
/// known to be invalid.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder with nothing pending.
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds `token` and returns the text it completes (often all of its own, sometimes nothing).
    /// On an unknown id nothing changes.
    pub fn push(&mut self, token: u32) -> Result<String, UnknownToken> {
        self.pending.extend(decode_bytes(&[token])?);
        let mut text = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    text.push_str(valid);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // The prefix is valid by the error's contract.
                    text.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // Bytes that no continuation can make valid.
                        Some(invalid) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[invalid..];
                        }
                        // The start of a character whose other bytes may come with the next token.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        Ok(text)
    }

    /// The text of the bytes still held (an incomplete character becomes U+FFFD), leaving nothing
    /// pending.
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_gpt2_token_ids() {
        assert_eq!(encode("Hello world"), [15496, 995]);
        assert_eq!(encode("Hello, world!"), [15496, 11, 995, 0]);
        assert_eq!(encode(""), Vec::<u32>::new());
        assert_eq!(decode(&[15496, 995]).unwrap(), "Hello world");
        assert_eq!(decode(&[END_OF_TEXT]).unwrap(), END_OF_TEXT_STR);
        // Special-token text is plain text unless asked for.
        assert_eq!(encode_with_special("Hi<|endoftext|>"), [17250, END_OF_TEXT]);
        assert!(!encode("Hi<|endoftext|>").contains(&END_OF_TEXT));
        assert_eq!(decode(&encode("Hi<|endoftext|>")).unwrap(), "Hi<|endoftext|>");
    }

    #[test]
    fn text_round_trips() {
        for text in [
            "Hello world",
            "  leading spaces, trailing tabs\t\t",
            "lines\n\nand\r\nmore lines\n",
            "numbers 1234567890 and punctuation: ;!?()[]{}<>",
            "don't we'll they've I'm you're she'd",
            "Unicode: naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어",
            "emoji 🔥🦀👩‍👩‍👧 and symbols ∑∫√ ≠ ≤",
            "\u{0}\u{1}\u{7f} control bytes",
        ] {
            let ids = encode(text);
            assert!(ids.iter().all(|&id| (id as usize) < VOCAB_SIZE - 1), "{text}: {ids:?}");
            assert_eq!(decode(&ids).unwrap(), text);
            assert_eq!(decode_bytes(&ids).unwrap(), text.as_bytes());
        }
    }

    #[test]
    fn an_unknown_id_is_an_error() {
        let e = decode(&[15496, 50257]).unwrap_err();
        assert_eq!(e, UnknownToken { id: 50257 });
        assert!(e.to_string().contains("50257") && e.to_string().contains("0..50257"), "{e}");
        let mut stream = StreamDecoder::new();
        assert_eq!(stream.push(u32::MAX), Err(UnknownToken { id: u32::MAX }));
    }

    /// Streams `tokens` one at a time; returns the pieces emitted (the last from `finish`).
    fn stream(tokens: &[u32]) -> Vec<String> {
        let mut decoder = StreamDecoder::new();
        let mut pieces: Vec<String> = tokens.iter().map(|&t| decoder.push(t).unwrap()).collect();
        pieces.push(decoder.finish());
        pieces
    }

    #[test]
    fn streaming_emits_only_complete_characters() {
        // Characters that GPT-2 splits across tokens: each token's bytes alone are not UTF-8.
        let text = "🔥日本語🦀";
        let ids = encode(text);
        assert!(ids.iter().any(|&id| std::str::from_utf8(&decode_bytes(&[id]).unwrap()).is_err()), "{ids:?}");
        let pieces = stream(&ids);
        assert_eq!(pieces.concat(), text);
        for piece in &pieces {
            assert!(!piece.contains(char::REPLACEMENT_CHARACTER), "{pieces:?}");
        }
        // The text appears as soon as each character is complete, never later.
        let mut shown = String::new();
        let mut decoder = StreamDecoder::new();
        for (i, &id) in ids.iter().enumerate() {
            shown.push_str(&decoder.push(id).unwrap());
            let bytes = decode_bytes(&ids[..=i]).unwrap();
            let complete = match std::str::from_utf8(&bytes) {
                Ok(s) => s.len(),
                Err(e) => e.valid_up_to(),
            };
            assert_eq!(shown.as_bytes(), &bytes[..complete], "after token {i}");
        }
    }

    #[test]
    fn streaming_equals_decoding_everything_even_for_invalid_utf8() {
        let fire = encode("🔥");
        assert!(fire.len() >= 2, "{fire:?}");
        let cases: Vec<Vec<u32>> = vec![
            // A character cut off at the end (generation stopped mid-character).
            fire[..fire.len() - 1].to_vec(),
            // A cut-off character followed by ordinary text.
            [&fire[..1], &encode(" after")[..]].concat(),
            // Continuation bytes alone, then a full character.
            [&fire[1..], &fire[..]].concat(),
            // Every token id of a range, many of them lone bytes.
            (0..400).collect(),
            (50000..50257).collect(),
        ];
        for ids in cases {
            let pieces = stream(&ids);
            assert_eq!(pieces.concat(), decode(&ids).unwrap(), "{ids:?}");
        }
        // Nothing is held back once it cannot complete: a lone continuation byte is U+FFFD at once.
        let mut decoder = StreamDecoder::new();
        assert_eq!(decoder.push(fire[fire.len() - 1]).unwrap().chars().last(), Some(char::REPLACEMENT_CHARACTER));
        assert_eq!(decoder.finish(), "");
    }
}
