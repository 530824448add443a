//! `kiln generate`: text from a GPT-2 checkpoint (Hugging Face safetensors layout), decoded with
//! a key/value cache (`nn::CachedDecoder`) and GPT-2's tokenizer, streamed as it is produced.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Instant;

use nn::{CachedDecoder, GenerateConfig, Gpt2Options, Sampling};

use crate::tokenizer::{self, StreamDecoder};

/// GPT-2's `<|endoftext|>`: generation stops there when the vocabulary has it.
pub const END_OF_TEXT: u32 = 50256;

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateArgs {
    /// The safetensors file (a `config.json` beside it gives the number of heads).
    pub weights: PathBuf,
    /// Heads per block, when no `config.json` gives them.
    pub n_heads: Option<usize>,
    pub prompt: String,
    pub max_new_tokens: usize,
    /// `None` or 0: greedy.
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub seed: u64,
}

/// What a generation produced and how long it took.
pub struct Generated {
    pub prompt_tokens: usize,
    pub tokens: Vec<u32>,
    pub text: String,
    /// Seconds from the first feed to the last token.
    pub seconds: f64,
}

/// Loads the checkpoint, encodes the prompt and decodes, calling `out` with each piece of text
/// as soon as it is complete UTF-8.
pub fn generate(args: &GenerateArgs, mut out: impl FnMut(&str)) -> anyhow::Result<Generated> {
    let options = Gpt2Options { n_heads: args.n_heads, ..Gpt2Options::default() };
    let mut model = nn::load_gpt2_with(&args.weights, &options)?;
    let prompt = tokenizer::encode(&args.prompt);
    if prompt.is_empty() {
        anyhow::bail!("the prompt encodes to no tokens");
    }
    let vocab = model.config.vocab_size;
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        anyhow::bail!("the prompt has token {bad}, outside the model's vocabulary of {vocab}");
    }
    let sampling = match args.temperature {
        None | Some(0.0) if args.top_k.is_none() && args.top_p.is_none() => Sampling::Greedy,
        t => Sampling::Sample { temperature: t.unwrap_or(1.0), top_k: args.top_k, top_p: args.top_p },
    };
    let stop_tokens = if (END_OF_TEXT as usize) < vocab { vec![END_OF_TEXT] } else { Vec::new() };
    let config = GenerateConfig { max_new_tokens: args.max_new_tokens, sampling, seed: args.seed, stop_tokens };
    let mut stream = StreamDecoder::new();
    let mut failure = None;
    let mut decoder = CachedDecoder::new(&mut model);
    let t0 = Instant::now();
    let new = nn::generate(&mut decoder, std::slice::from_ref(&prompt), &config, |step| {
        if let Some(Some(token)) = step.first() {
            if *token == END_OF_TEXT {
                return ControlFlow::Continue(());
            }
            match stream.push(*token) {
                Ok(text) => out(&text),
                Err(e) => {
                    failure = Some(e);
                    return ControlFlow::Break(());
                }
            }
        }
        ControlFlow::Continue(())
    })?;
    if let Some(e) = failure {
        return Err(e.into());
    }
    out(&stream.finish());
    let seconds = t0.elapsed().as_secs_f64();
    let tokens = new.into_iter().next().unwrap_or_default();
    let shown: Vec<u32> = tokens.iter().copied().filter(|&t| t != END_OF_TEXT).collect();
    Ok(Generated { prompt_tokens: prompt.len(), text: tokenizer::decode(&shown)?, tokens, seconds })
}

/// `kiln generate`: prints the prompt, then the new text as it streams, then a summary line on
/// stderr.
pub fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout();
    print!("{}", args.prompt);
    stdout.flush()?;
    let generated = generate(args, |text| {
        print!("{text}");
        let _ = std::io::stdout().flush();
    })?;
    println!();
    eprintln!(
        "[{} prompt tokens, {} new tokens in {:.2} s: {:.1} tokens/s]",
        generated.prompt_tokens,
        generated.tokens.len(),
        generated.seconds,
        generated.tokens.len() as f64 / generated.seconds.max(1e-9)
    );
    Ok(())
}
