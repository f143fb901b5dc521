#!/usr/bin/perl
# Makes tools/serve/chat.html a C file (the Makefile's rule; #embed is not C11): the page's bytes
# as g4_chat_html[] and g4_chat_html_len, and g4_chat_csp, the Content-Security-Policy it is served
# with. The policy allows the page's one inline <script> and <style> by their SHA-256 (CSP level
# 2 hashes), so nothing else can run or style it, not even markup that found its way in.
# usage: embed_page.pl chat.html > chat_html.c
use strict;
use warnings;
use Digest::SHA qw(sha256_base64);

local $/;
my $path = shift or die "usage: $0 PAGE.html\n";
open(my $f, '<:raw', $path) or die "$path: $!\n";
my $page = <$f>;
close $f;

my %hash;
for my $tag ('script', 'style') {
    my @blocks = $page =~ /<$tag>(.*?)<\/$tag>/gs;
    die "$path: expected exactly one <$tag> block, found " . scalar(@blocks) . "\n" if @blocks != 1;
    my $h = sha256_base64($blocks[0]);
    $h .= '=' while length($h) % 4;    # CSP wants padded base64
    $hash{$tag} = $h;
}
my $csp = "default-src 'none'; script-src 'sha256-$hash{script}'; style-src 'sha256-$hash{style}'; connect-src 'self'; "
        . "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

print "/* generated from $path by tools/serve/embed_page.pl: do not edit */\n";
print "const unsigned char g4_chat_html[] = {\n";
my @bytes = unpack('C*', $page);
for (my $i = 0; $i < @bytes; $i += 16) {
    my $end = $i + 15 < $#bytes ? $i + 15 : $#bytes;
    print join(',', map { sprintf '0x%02x', $_ } @bytes[$i .. $end]), ",\n";
}
print "};\n";
printf "const unsigned int g4_chat_html_len = %d;\n", scalar(@bytes);
print "const char g4_chat_csp[] = \"$csp\";\n";
